"""What one parse of the workflow decides, as plain methods: which cells a sweep has, which of
them are stale and why, which self-test gates which cell, what is redone for a damaged file,
which checkpoints wait, and each rule's inputs and params.

`workflow/rules/common.smk` is a table of one-line input functions over one `SweepPlan`; what
only Snakemake can express (`ancient`, `storage.s3`) is added there, marked here: an input
read by content is a `ByContent` path (its path and modification time rerun nothing; its content
is in the job's identity). Every decision is made from the config, the files under `outdir` and
the verbs of the invocation, so a unit test asks the same questions without running Snakemake.

Planning is read-only (docs/reruns.md): only `sync_source_identities` writes, the content-keyed
cache under `sources/`, and only when the main process parses.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckpteval.checkpoints import sync_s3_identity, sync_source_identity
from ckpteval.config import Plan, resolve_path, sampling_configs
from ckpteval.contract import Identity, content_options
from ckpteval.engine.plan import EnginePlan
from ckpteval.engine.schedule import InferCosts
from ckpteval.errors import UserError
from ckpteval.freshness import Freshness, StaleCell
from ckpteval.io import sha256_json
from ckpteval.plan.layout import CellKey, Layout
from ckpteval.publish import TRACKERS
from ckpteval.selftest import selftest_identity, separate
from ckpteval.verbs import Verbs, damaged_json, redo_path


def runs_regex(names: list[str]) -> str:
    """A wildcard constraint matching exactly these run names."""
    return "|".join(re.escape(n) for n in names)


class ByContent(str):
    """An input path the job reads by content: Snakemake must not rerun it for the file's path
    or modification time (common.smk wraps it in `ancient`)."""


def _warn(line: str) -> None:
    print(f"ckpteval: warning: {line}", file=sys.stderr)


class SweepPlan:
    """The decisions of one parse, memoized for its length (input functions ask per job).

    `verbs` is called when first needed: what the invocation forces (-f, -R, -F) is known only
    once Snakemake builds its DAG. `main` says whether this is the invocation's main process (a
    cluster job's own parse finds the redo inputs the main process planned)."""

    def __init__(
        self,
        plan: Plan,
        *,
        verbs: Callable[[], Verbs] = Verbs,
        main: bool = True,
        warn: Callable[[str], None] = _warn,
    ) -> None:
        self.plan, self.main, self.warn = plan, main, warn
        self._verbs = verbs
        self.layout = Layout(plan.outdir)
        self.fresh = Freshness(plan)
        #: Every (task, variant) of a checkpoint: a cell is a checkpoint and one of these.
        self.pairs = [(t, v) for t, vs in plan.task_variants.items() for v in vs]
        #: This invocation, as its request files name it (an engine job chains only within it).
        self.invocation = f"{os.getpid()}-{time.time_ns()}"
        #: The engine jobs of this invocation (ckpteval.engine.plan; which cells: ckpteval.verbs).
        self.engines = EnginePlan(plan, self.fresh, self.verbs, self.invocation)
        self.infer_costs = InferCosts(plan)

    @functools.cache  # noqa: B019 - one object per parse
    def verbs(self) -> Verbs:
        return self._verbs()

    # ---- the cells

    def cells(self) -> tuple[CellKey, ...]:
        """Every cell the config asks for, in step order."""
        return self.plan.cell_keys

    def cell_files(self) -> list[str]:
        """Every cell's generation meta and score cell: targets of `all`, so that a deleted one
        is made again (Snakemake reruns a job for a missing file only if a job in its graph asks
        for it: no job reads a meta, and the aggregate job's asking for a score cell does not
        rerun a missing one: tests/test_status.py). A cell's generation file and model card are
        asked for by its evaluate job already, even when nothing is planned; asking `all` for
        them too cost 2,100 more producer lookups at 100 x 20 cells and decided nothing."""
        files = []
        for cell in self.cells():
            files += (self.layout.generation_meta(cell), self.layout.score(cell))
        return files

    def stale(self, cell: CellKey) -> StaleCell | None:
        """The cell if its generation file must be (re)written, and why (ckpteval.freshness)."""
        return self.fresh.stale(cell)

    def rescored(self, cell: CellKey) -> str | None:
        """Why this invocation (re)scores a cell, or None for a current one: not scored yet, a
        reason its score file is outdated (`Freshness.rescore_reason`, which `ckpteval status`
        and the deleted checkpoints' kept cells read too), or a forced evaluate."""
        score = self.layout.score(cell)
        if not os.path.exists(score):
            return "not scored yet"
        why = self.fresh.rescore_reason(cell)
        if why is not None:
            return why
        if self.verbs().forces_rule("evaluate") or self.verbs().forces_file(
            score, self.layout.score_samples(cell)
        ):
            return "forced"
        return None

    def waiting(self) -> list[str]:
        """`run/ckpt` of every checkpoint being written: not planned until complete."""
        return [f"{run}/{u.name}" for run, u in self.plan.waiting]

    # ---- what the main process says and keeps when it parses

    def sync_source_identities(self) -> None:
        """Keep each checkpoint's content identity current (only new bytes move its mtime): the
        one cache keyed by content a parse may write."""
        for run in self.plan.runs.values():
            if not run.has_weights:
                continue
            for ckpt in run.checkpoints:
                id_file = self.fresh.source_id_path(run.name, ckpt.name)
                id_file.parent.mkdir(parents=True, exist_ok=True)
                manifest = self.fresh.manifest_path(run.name, ckpt.name)
                if ckpt.url:  # on S3: from the listing, nothing downloaded
                    sync_s3_identity(ckpt, id_file, manifest)
                else:
                    sync_source_identity(ckpt.path, id_file, manifest)

    def damaged_manifests(self) -> list[str]:
        """Lines about model manifests that do not parse (they are rebuilt)."""
        return [
            f"{path} did not parse; rebuilt"
            for run in self.plan.runs.values()
            for ckpt in run.checkpoints
            if damaged_json(path := self.fresh.manifest_path(run.name, ckpt.name))
        ]

    def rerun_lines(self) -> list[str]:
        """What this invocation will redo for a changed setting, in words (ckpteval.freshness)."""
        return self.fresh.explain(self.pairs)

    # ---- consolidate and model cards

    def has_s3(self) -> bool:
        return any(c.url for r in self.plan.runs.values() for c in r.checkpoints)

    def checkpoint_source(self, run: str, ckpt: str) -> list[str]:
        """What consolidation reads: the checkpoint's directory, or on S3 the URLs of the
        objects it needs (Snakemake downloads them); nothing for a deleted checkpoint."""
        found = self.plan.checkpoint(run, ckpt)
        if found.deleted:
            return []
        if found.url:
            return [f"{found.url}/{o.rel}" if o.rel else found.url for o in found.objects]
        return [str(found.path)]

    def source_identity_file(self, run: str, ckpt: str) -> str | None:
        """The checkpoint's content identity (ckpteval.checkpoints.sync_source_identity): its
        modification time moves only when the checkpoint's bytes do. None when deleted."""
        if self.plan.checkpoint(run, ckpt).deleted:
            return None
        return self.layout.source_id(run, ckpt)

    def base_model(self, run: str) -> ByContent | None:
        """The run's base model: its content is in the identity param."""
        base = self.plan.runs[run].base_model
        return ByContent(base) if base else None

    def model_identity(self, run: str, ckpt: str) -> str:
        """The consolidate (or model card) job's identity param (ckpteval.contract)."""
        return self.fresh.model_identity(run, ckpt).text

    def model_redo_input(self, run: str, ckpt: str) -> dict[str, str]:
        """A damaged model card's redo input (consolidate, model_card), or none."""
        found = self.model_redo(run, ckpt)
        return {"redo": found} if found else {}

    def model_card_settings(self, run: str, ckpt: str) -> dict[str, Any]:
        """What a weightless run's model card records (a change reruns it and everything
        after): the endpoint, or the replayed files by content (a moved project keeps them)."""
        found = self.plan.runs[run]
        if found.backend == "openai":
            return {"base_url": found.endpoint["base_url"], "model": found.endpoint["model"]}
        step = self.plan.checkpoint(run, ckpt).step
        return {"solutions": self.plan.solutions_id(run, step)}

    def consolidate_priority(self, run: str, ckpt: str) -> float:
        """The sum of the checkpoint's infer jobs' expected GPU seconds: the longest first."""
        total = sum(
            self.infer_costs(run, ckpt, self.engines.group_jobs(g)) for g in self.plan.engine_groups
        )
        return float(f"{total:.6g}")

    # ---- infer

    def infer_priority(self, run: str, ckpt: str, group: str) -> float:
        """An engine job's expected GPU seconds (ckpteval.engine.schedule)."""
        cells, _ = self.engines.cells_and_round(run, ckpt, group)
        stale = [(c.key.task, c.key.variant) for c in cells]
        return float(f"{self.infer_costs(run, ckpt, stale):.6g}")

    def engine_targets(self) -> list[str]:
        """The done files of the engine jobs with cells to (re)generate: targets of `all`."""
        weighted = [*self.plan.runs_with_backend("vllm"), *self.plan.runs_with_backend("openai")]
        return self.engines.targets(weighted)

    def generation_identity(self, cell: CellKey) -> str:
        """A generation job's identity param: the same for every checkpoint of a run."""
        return self.fresh.generation_identity(cell.run, cell.task, cell.variant).text

    def solutions(self, cell: CellKey) -> list[ByContent]:
        """A replay cell's solution files, read by content: their hash is in the model card
        (`runs.*.solutions` is a model key), so new bytes rewrite the card and the replay job
        reruns through it; a touched or copied file (same bytes, new mtime) reruns nothing, as
        `ckpteval status` says."""
        step = self.plan.checkpoint(cell.run, cell.ckpt).step
        files = self.plan.runs[cell.run].solutions_files(cell.task, cell.variant, step)
        return [ByContent(str(p)) for p in files]

    def task_options(self, task: str) -> str:
        """A replay job's task options (those that define the task, no paths): its step checks
        them against the definition in its identity (ckpteval.jobs.CellJob)."""
        return json.dumps(self.plan.tasks[task].identity_options(), sort_keys=True)

    # ---- tail assist (ckpteval.engine.assist)

    @functools.cache  # noqa: B019 - once per parse: every assist job's input is the same list
    def pending_infer_checkpoints(self) -> tuple[tuple[str, str], ...]:
        """(run, ckpt) of vllm runs with a generation file still to write."""
        return tuple(
            (run, c.name)
            for run in self.plan.runs_with_backend("vllm")
            for c in self.plan.runs[run].checkpoints
            if self.fresh.stale_cells(run, c.name, self.pairs)
        )

    def assist_records(self, gpus: int, engine_gpus: int, assist: bool) -> list[str]:
        """One assist job per engine's worth of `gpus` beyond the first, when `assist` is on and
        some vllm checkpoint has generations to write; named by what is pending, so a later
        sweep gets fresh ones and a finished one none."""
        count = gpus // engine_gpus - 1
        pending = self.pending_infer_checkpoints() if assist and count > 0 else ()
        if not pending:
            return []
        token = sha256_json(sorted(pending))[:12]
        return [self.layout.assist_record(token, i) for i in range(count)]

    def assist_inputs(self) -> list[str]:
        """An assist job starts once every pending checkpoint is consolidated: from then on,
        every infer job is ready and (higher priority) gets a GPU before any assist job does."""
        return [self.layout.manifest(run, ckpt) for run, ckpt in self.pending_infer_checkpoints()]

    # ---- redo inputs (ckpteval.verbs): a damaged result is redone without the parse removing it

    @functools.cache  # noqa: B019
    def redo_input(self, path: str) -> str:
        """The redo input of the job that makes `path`, a damaged file: a missing input made by
        rule `redo`, a target of `all`. A cluster job's own parse finds the one the main process
        planned (and rule `redo` made)."""
        return str(redo_path(Path(self.layout.redo_root()), Path(path), fresh=self.main))

    @functools.cache  # noqa: B019
    def model_redo(self, run: str, ckpt: str) -> str | None:
        """A damaged model card's redo input, or None."""
        path = self.layout.manifest(run, ckpt)
        return self.redo_input(path) if damaged_json(Path(path)) else None

    @functools.cache  # noqa: B019
    def score_redo(self, cell: CellKey) -> str | None:
        """A damaged score cell's redo input, or None (one read of the cell per parse, shared
        with the rerun explanation: ckpteval.freshness)."""
        if not self.fresh.score_damaged(cell):
            return None
        return self.redo_input(self.layout.score(cell))

    def redo_targets(self) -> list[str]:
        """Every redo input of this invocation: targets of `all`."""
        found = [
            self.model_redo(run.name, c.name)
            for run in self.plan.runs.values()
            for c in run.checkpoints
            if not c.deleted
        ]
        found += [self.score_redo(cell) for cell in self.cells()]
        found.append(self.summary_redo())
        return sorted(f for f in found if f)

    @functools.cache  # noqa: B019
    def summary_redo(self) -> str | None:
        """The summary job's redo input when a plot of the last build is missing from the
        published `summary/plots/` (a directory output: Snakemake sees only that it exists).
        The job then publishes the build again; nothing is rebuilt. A shard has no summary."""
        if self.plan.shard is not None:
            return None
        published = self.layout.summary("plots")
        try:
            built = set(os.listdir(self.layout.summary_staged("plots")))
            there = set(os.listdir(published))
        except OSError:  # no build yet, or no plots published: Snakemake plans that itself
            return None
        missing = {n for n in built - there if not n.startswith(".")}
        return self.redo_input(published) if missing else None

    # ---- evaluate and its self-tests

    def evaluate_inputs(self, cell: CellKey) -> dict[str, str]:
        """A cell's generation file and model card, its checker's files, its redo input if its
        score cell is damaged, its self-test verdict where one gates it, and its task's problem
        file if it has one."""
        inputs: dict[str, str] = {
            "generations": self.layout.generation(cell),
            "manifest": self.layout.manifest(cell.run, cell.ckpt),
            **self.checker_files(cell.task),
        }
        redo = self.score_redo(cell)
        if redo:
            inputs["redo"] = redo
        verdict = self.selftest_input(cell)
        if verdict:
            inputs["selftest"] = verdict
        problems = self.problems_file(cell.task)
        if problems:
            inputs["problems"] = problems
        return inputs

    @functools.cache  # noqa: B019
    def selftest_of(self, run: str, task: str, variant: str) -> Identity | None:
        """The identity of the self-test that gates a cell's scoring (rule selftest,
        ckpteval.selftest), or None for a checker that self-tests in its evaluate job."""
        if not separate(self.plan.tasks[task].checker):
            return None
        return selftest_identity(self.fresh.scoring_identity(run, task, variant))

    @functools.cache  # noqa: B019
    def selftest_identities(self) -> dict[tuple[str, str], Identity]:
        """(task, key) -> identity of every self-test of the plan."""
        found = {}
        for cell in self.cells():
            identity = self.selftest_of(cell.run, cell.task, cell.variant)
            if identity is not None:
                found[(cell.task, identity.digest)] = identity
        return found

    def selftest_identity(self, task: str, key: str) -> str:
        """A selftest job's identity param, by its output's name."""
        try:
            return self.selftest_identities()[(task, key)].text
        except KeyError:
            raise UserError(
                f"no self-test {key} of task {task!r} in the plan: ask for the cells, not for "
                f"{self.layout.selftest_verdict(task, key)}"
            ) from None

    def selftest_input(self, cell: CellKey) -> str | None:
        """A reward cell's self-test verdict, a plain input of every cell this invocation
        (re)scores and no input of a current one: a verdict not made yet, removed or forced
        never reruns a current cell, and a cell that is rescored always waits for a self-test
        Snakemake reruns. Never an `ancient` input: a self-test that Snakemake reruns (an
        interrupted one, incomplete) hides the own reasons of the jobs it feeds through an
        ancient input, so the rerun ran the self-test alone, said done and left the cells
        unscored (snakemake/snakemake#4166). Which cells are rescored is `rescored`, the reasons
        `ckpteval status` shows (a newer generation file or model card among them); a cell
        Snakemake rescores for a reason of its own beyond those self-tests in its evaluate
        job, as other checkers do."""
        identity = self.selftest_of(cell.run, cell.task, cell.variant)
        if identity is None or self.rescored(cell) is None:
            return None
        return self.layout.selftest_verdict(cell.task, identity.digest)

    def gates(self) -> dict[str, list[CellKey]]:
        """Self-test verdict -> the cells this invocation (re)scores that wait for it."""
        found: dict[str, list[CellKey]] = {}
        for cell in self.cells():
            verdict = self.selftest_input(cell)
            if verdict:
                found.setdefault(verdict, []).append(cell)
        return found

    def checker_files(self, task: str) -> dict[str, ByContent]:
        """The files a task's `checker:` mapping names (a reward function's), as inputs named
        `checker_<option>`: read by content, like the problem file."""
        spec = self.plan.tasks[task]
        if not isinstance(spec.options.get("checker"), dict):
            return {}
        return {
            f"checker_{option}": ByContent(spec.checker_file(option))
            for option in content_options(spec.checker)
            if option in spec.options["checker"]
        }

    def problems_file(self, task: str) -> ByContent | None:
        """The problem file of a task (`tasks.<name>.problems`), or None: read by the evaluate
        job, which builds its own task only; its content is in the job's identity."""
        path = self.plan.tasks[task].options.get("problems")
        return None if path is None else ByContent(resolve_path(str(path), Path.cwd()))

    def scoring_identity(self, cell: CellKey) -> str:
        """An evaluate job's identity param."""
        return self.fresh.scoring_identity(cell.run, cell.task, cell.variant).text

    def cell_params(self, cell: CellKey) -> dict[str, Any]:
        """The evaluate job's `cell` param."""
        ckpt = self.plan.checkpoint(cell.run, cell.ckpt)
        return {
            "run": cell.run,
            "ckpt": cell.ckpt,
            "step": ckpt.step,
            "task": cell.task,
            "variant": cell.variant,
            "is_baseline": ckpt.is_base,
        }

    # ---- the summary

    @functools.cache  # noqa: B019 - once per parse, and its warnings said once
    def kept_deleted_cells(self) -> tuple[str, ...]:
        """Score files of checkpoints whose source is gone, still valid for the current config:
        they stay in the summary (marked). A deleted checkpoint's cell that a changed setting
        outdated (by the reason a live cell is rescored: `Freshness.rescore_reason`) cannot be
        recomputed, and is left out with a warning."""
        kept = []
        for run, ckpts in self.plan.deleted.items():
            for ckpt in ckpts:
                for task, variant in self.pairs:
                    cell = CellKey(run, ckpt.name, task, variant)
                    path = self.layout.score(cell)
                    if not os.path.exists(path):
                        continue
                    why = self.fresh.rescore_reason(cell)
                    if why is not None:
                        self.warn(
                            f"run {run}: checkpoint {ckpt.name} was deleted; "
                            f"its {task} {variant} scores are outdated ({why}) and left out"
                        )
                        continue
                    kept.append(path)
        return tuple(kept)

    def score_files(self) -> list[str]:
        """The cells the summary reads: the plan's and the kept ones of deleted checkpoints."""
        return [*self.plan.score_files(), *self.kept_deleted_cells()]

    def summary_cells_digest(self) -> str:
        """Which cells the summary holds: a cell that leaves the plan rebuilds it."""
        return sha256_json(sorted(self.score_files()))[:16]

    def summary_outputs(self) -> dict[str, str]:
        """The summary's files that depend on the config: `training_curve.csv` when a run has
        `train_logs` (its curves beside the trainer's; ckpteval.aggregate.training)."""
        if any(run.get("train_logs") for run in self.plan.config["runs"].values()):
            return {"training_curve": self.layout.summary("training_curve.csv")}
        return {}

    def sampling_settings(self) -> dict[str, dict[str, Any]]:
        """The sampling configs by name (either form the config writes them in, resolved): the
        summary compares them with a trainer's validation settings (runs.<name>.train_logs)."""
        return {
            name: {
                "temperature": s.temperature,
                "top_p": s.top_p,
                "max_new_tokens": s.max_new_tokens,
                "n": s.n,
            }
            for name, s in sampling_configs(self.plan.config["sampling"]).items()
        }

    def deleted_checkpoints(self) -> list[str]:
        return sorted(f"{run}/{c.name}" for run, ckpts in self.plan.deleted.items() for c in ckpts)

    def publish_records(self) -> list[str]:
        """One record per configured tracker; none configured: the job says so in one line."""
        publish = self.plan.config["publish"]
        return [self.layout.published(t) for t in TRACKERS if publish.get(t)]
