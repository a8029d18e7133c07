"""Where every file of a sweep lives under `outdir`: the one place a `results/` path is spelled.

The rules' outputs, the parse's freshness checks, `ckpteval status`, `compare` and the report all
ask this module, so a path is never spelled twice and never drifts. A `Layout` gives a path for
given names; given Snakemake wildcards (`WILDCARDS`, `"{run}"`, ...) the same call gives a rule's
`output:` template. Paths are `str` (what Snakemake takes; input functions run once per
job, so no `Path` object is built for them); wrap one in `Path` to read it.

The file contracts (what each file holds) are in README.md's table; the writers own the schemas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class CellKey:
    """One cell of a sweep: a checkpoint of a run, scored on one task with one sampling variant.

    The record every planner passes where a cell is named (its files: `Layout.generation`,
    `Layout.score`, ...); ordered as the directories nest."""

    run: str
    ckpt: str
    task: str
    variant: str

    @classmethod
    def of(cls, named: Any) -> CellKey:
        """The cell a Snakemake job's wildcards (or any object with the four names) name."""
        return cls(named.run, named.ckpt, named.task, named.variant)

    @property
    def rel(self) -> str:
        """`run/ckpt/task/variant`: the cell's place under each step's directory."""
        return f"{self.run}/{self.ckpt}/{self.task}/{self.variant}"


#: The cell whose paths are the rules' templates.
WILDCARDS = CellKey("{run}", "{ckpt}", "{task}", "{variant}")

#: The directories under `outdir` whose paths name a checkpoint or a cell below them
#: (`run/ckpt[/task/variant]`, as `Layout` spells them): `ckpteval status` tells from a
#: file's path which cells it concerns.
CELL_STEPS = ("models", "generations", "scores")


@dataclass(frozen=True)
class Layout:
    """The paths under `out` (the config's `outdir`)."""

    out: str

    # ---- consolidate: one model per checkpoint
    def models_of(self, run: str) -> str:
        """Every model and model card of a run (their names are its checkpoints')."""
        return f"{self.out}/models/{run}"

    def model_dir(self, run: str, ckpt: str) -> str:
        """The consolidated HF directory vLLM loads."""
        return f"{self.out}/models/{run}/{ckpt}"

    def manifest(self, run: str, ckpt: str) -> str:
        """The model's manifest (a weightless run's model card)."""
        return f"{self.out}/models/{run}/{ckpt}.json"

    def source_id(self, run: str, ckpt: str) -> str:
        """The checkpoint's content identity (ckpteval.checkpoints.sync_source_identity)."""
        return f"{self.out}/sources/{run}/{ckpt}.json"

    # ---- infer and evaluate: one file pair per cell
    def generations_of(self, run: str) -> str:
        return f"{self.out}/generations/{run}"

    def generation(self, cell: CellKey) -> str:
        return f"{self.out}/generations/{cell.rel}.jsonl"

    def generation_meta(self, cell: CellKey) -> str:
        return f"{self.out}/generations/{cell.rel}.meta.json"

    def scores(self) -> str:
        """Every score cell, as `{run}/{ckpt}/{task}/{variant}.json` below it."""
        return f"{self.out}/scores"

    def score(self, cell: CellKey) -> str:
        """The cell's metrics, written last: its presence means the cell is done."""
        return f"{self.out}/scores/{cell.rel}.json"

    def score_samples(self, cell: CellKey) -> str:
        return f"{self.out}/scores/{cell.rel}.jsonl"

    def scores_of(self, run: str) -> str:
        """Every score cell of a run, below a directory per checkpoint."""
        return f"{self.out}/scores/{run}"

    def checkpoint_scores(self, run: str, ckpt: str) -> str:
        """Every score cell of a checkpoint, as `{task}/{variant}.json` below it."""
        return f"{self.out}/scores/{run}/{ckpt}"

    # ---- what the jobs stage and cache
    def staging(self, run: str, ckpt: str) -> str:
        """An engine job's staging directory for one checkpoint (ckpteval.verbs)."""
        return f"{self.out}/staging/{run}/{ckpt}"

    def staging_of(self, run: str) -> str:
        return f"{self.out}/staging/{run}"

    def redo_root(self) -> str:
        """Where redo inputs live (ckpteval.verbs.redo_path)."""
        return f"{self.out}/staging/redo"

    def selftest_verdict(self, task: str, key: str) -> str:
        """A self-test's verdict, named by its identity's digest `key` (ckpteval.selftest)."""
        return f"{self.out}/staging/selftest/{task}.{key}.json"

    def summary_staging(self) -> str:
        """Where the aggregate job builds the summary (published to `summary/` once complete);
        named so that no run has it (run names start with a letter or digit)."""
        return f"{self.out}/staging/_summary"

    def summary_staged(self, name: str) -> str:
        """A file of the summary's build."""
        return f"{self.summary_staging()}/{name}"

    def cache(self) -> str:
        """The engine jobs' content-addressed generation cache (not a declared output)."""
        return f"{self.out}/cache"

    def assist_record(self, token: str, i: int | str) -> str:
        return f"{self.out}/assist/{token}/{i}.json"

    # ---- the summary
    def summary_dir(self) -> str:
        return f"{self.out}/summary"

    def summary(self, name: str) -> str:
        """A file of the summary (`metrics.parquet`, `plots`, `report.html`, ...)."""
        return f"{self.out}/summary/{name}"

    def published(self, tracker: str) -> str:
        """A tracker's ledger of what `publish` sent it."""
        return f"{self.out}/summary/published/{tracker}.json"
