"""Where every file of a sweep lives under `outdir`: the one place a `results/` path is spelled.

The rules' outputs, the parse's freshness checks, `ckpteval status`, `compare` and the report all
ask this module, so a path is never spelled twice and never drifts. A `Layout` gives a path for
given names; given Snakemake wildcards (`WILDCARDS`, `"{run}"`, ...) the same call gives a rule's
`output:` template. Paths are `str` (what Snakemake takes; input functions run once per
job, so no `Path` object is built for them); wrap one in `Path` to read it.

A job, or `ckpteval` run on files outside a sweep, knows a file or directory it was given, not
the outdir: the module's functions give the paths beside those (a generation's meta, a score
cell's samples, an engine job's staged cells, done, request and claim files beside its staging
directory, a publish ledger in a summary directory), and `CellKey.at` reads a cell from a path.
tests/test_plan_package.py fails if a path under `outdir` is spelled anywhere else.

The file contracts (what each file holds) are in README.md's table; the writers own the schemas.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The file in the summary's build that holds the params the aggregate job built with.
SUMMARY_PARAMS = "build-params.json"


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

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> CellKey | None:
        """The cell a cell file names by its place, `.../{run}/{ckpt}/{task}/{variant}<suffix>`
        (any step's file: `.json`, `.jsonl`, `.meta.json`); None for a path too short."""
        parts = Path(path).parts[-4:]
        if len(parts) < 4:
            return None
        name = parts[-1]
        for suffix in _CELL_SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        return cls(*parts[:3], name)


#: A generation's meta, beside its `.jsonl`; a score cell's samples, beside its `.json`.
META_SUFFIX, SAMPLES_SUFFIX = ".meta.json", ".jsonl"
#: The suffixes of a cell's files, longest first (`CellKey.at` takes the first that fits).
_CELL_SUFFIXES = (META_SUFFIX, SAMPLES_SUFFIX, ".json")

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
        return f"{self.out}/generations/{cell.rel}{META_SUFFIX}"

    def scores(self) -> str:
        """Every score cell, as `{run}/{ckpt}/{task}/{variant}.json` below it."""
        return f"{self.out}/scores"

    def score(self, cell: CellKey) -> str:
        """The cell's metrics, written last: its presence means the cell is done."""
        return f"{self.out}/scores/{cell.rel}.json"

    def score_samples(self, cell: CellKey) -> str:
        return f"{self.out}/scores/{cell.rel}{SAMPLES_SUFFIX}"

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

    def engine_staging(self, run: str, ckpt: str, group_dir: str) -> str:
        """Where a checkpoint's engine job of an engine group writes its cells (the files in it
        and beside it: `staged_paths`, `done_path`, `request_path`, `claim_path`)."""
        return f"{self.staging(run, ckpt)}/{group_dir}"

    def redo_root(self) -> str:
        """Where redo inputs live (ckpteval.verbs.redo_path)."""
        return f"{self.out}/staging/redo"

    def redo(self, key: str) -> str:
        """One redo input (rule `redo`'s output; `key` names a damage: ckpteval.verbs.redo_path)."""
        return f"{self.redo_root()}/{key}"

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

    def summary_params(self) -> str:
        """The params the aggregate job built with (not published: rule `summary` publishes
        the build's named files)."""
        return self.summary_staged(SUMMARY_PARAMS)

    def content_memo(self) -> str:
        """Content hashes of large files kept across parses (ckpteval.content)."""
        return f"{self.out}/sources/content.json"

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
        """A tracker's record of the last `publish`."""
        return f"{self.out}/summary/published/{tracker}.json"


# ---- paths relative to a file or directory a job is given (a job, or `ckpteval` run on files
# outside any sweep, knows that path, not the outdir)


def generation_meta_of(generation: Path) -> Path:
    """A generation file's meta (backend, versions, timings, identity), beside it."""
    return generation.with_suffix(META_SUFFIX)


def score_samples_of(score: Path) -> Path:
    """A score cell's per-sample verdicts, beside its metrics file."""
    return score.with_suffix(SAMPLES_SUFFIX)


def score_samples_file(score: str) -> str:
    """`score_samples_of` as a string (the report keys 20,000 cells by them)."""
    return os.path.splitext(score)[0] + SAMPLES_SUFFIX


def generation_of_score(score: Path) -> Path:
    """The generation file a score cell of a sweep (`Layout.score`: the outdir four levels up)
    was scored from; for a path too short to be one, a name no file has."""
    return Path(generation_file_of_score(os.fspath(score)))


def generation_file_of_score(score: str) -> str:
    """`generation_of_score` as a string, by string operations where the path has its outdir
    and four parts below it (pathlib's were a tenth of a report rebuild at 10M samples)."""
    parts = os.path.normpath(score).split(os.sep)
    *root, run, ckpt, task, name = parts if len(parts) > 6 and ".." not in parts else [""] * 5
    if all(root[1:]) and name.endswith(".json") and len(name) > len(".json"):
        cell = CellKey(run, ckpt, task, name[: -len(".json")])
        return Layout(os.sep.join(root[:-1])).generation(cell)
    path = Path(score)
    cell = CellKey.at(path) or CellKey("", "", "", path.stem)
    root_dir = path.parents[4] if len(path.parents) > 4 else path.parent
    return Layout(os.fspath(root_dir)).generation(cell)


def published_in(summary: Path, name: str) -> Path:
    """A publish record or ledger in a summary directory (`Layout.published`; `ckpteval publish
    --summary` takes any summary directory)."""
    return summary / "published" / f"{name}.json"


def staged_paths(staging: Path, task: str, variant: str) -> tuple[Path, Path]:
    """Where an engine job writes a cell's generation file and meta in its staging directory
    (`Layout.engine_staging`)."""
    base = staging / task / variant
    return base.with_suffix(".jsonl"), base.with_suffix(META_SUFFIX)


#: An engine job's done or request file beside its staging directory: the group directory's
#: name, a round token (`r` and a serial number, the wildcard `token` of the engine rules).
ROUND = re.compile(r"^(?P<group>.+)\.(?P<token>r[0-9]+)\.(?:done|request\.json)$")


def done_path(staging: Path, token: str) -> Path:
    """The engine job's output for round `token` (ckpteval.verbs)."""
    return staging.with_name(f"{staging.name}.{token}.done")


def request_path(staging: Path, token: str) -> Path:
    """Which cells the engine job of round `token` generates (written when the run starts)."""
    return staging.with_name(f"{staging.name}.{token}.request.json")


def request_glob(group_dir: str) -> str:
    """Every request file of an engine group's jobs of a run, below the run's staging directory
    (`Layout.staging_of`)."""
    return f"*/{glob.escape(group_dir)}.r*.request.json"


def staging_of(done: Path) -> Path:
    """The staging directory of an engine job's done or request file."""
    match = ROUND.match(done.name)
    if match is None:
        raise ValueError(f"{done}: not an engine job's done or request file")
    return done.with_name(match["group"])


def claim_path(staging: Path) -> Path:
    """The lock an engine job holds on a checkpoint's staging directory while generating."""
    return staging.with_name(staging.name + ".claim")
