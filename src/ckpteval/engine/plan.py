"""The engine jobs of one Snakemake invocation, as the workflow plans them: which cells each
(re)generates, its round token, its done and request files, and the generation jobs' edges to
it. One object per parse (`EnginePlan`), which `workflow/rules/common.smk` asks; how the verbs
decide which cells (ckpteval.verbs) is unchanged.

It reads only: the request files are written when a run starts (`write_requests`, from the
Snakefile's `onstart`, never in a dry run), so a parse changes no job's files.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ckpteval.contract import engine_payload
from ckpteval.plan.layout import CellKey, Layout, done_path, request_path
from ckpteval.verbs import Verbs, next_round, request_body, requested, write_request


def infer_rule_name(prefix: str, group: str) -> str:
    """`infer` / `endpoint` for the default engine group, `<prefix>_<group>` for named ones."""
    return f"{prefix}_{group}" if group else prefix


class EnginePlan:
    """The engine side of one parse. `verbs` is called when first needed (what the invocation
    forces is known only once Snakemake builds its DAG); `invocation` names this invocation in
    the request files (an engine job chains only within it)."""

    def __init__(self, plan: Any, fresh: Any, verbs: Callable[[], Verbs], invocation: str) -> None:
        self.plan, self.fresh, self.verbs, self.invocation = plan, fresh, verbs, invocation
        self.layout = Layout(plan.outdir)
        #: Engine rule name -> its engine group.
        self.rules = {
            infer_rule_name(prefix, group): group
            for group in plan.engine_groups
            for prefix in ("infer", "endpoint")
        }

    # ---- names

    def staging_dir(self, group: str) -> str:
        """Where an engine job of `group` writes its checkpoint's cells (a wildcard pattern)."""
        return self.layout.engine_staging("{run}", "{ckpt}", group or "main")

    def done_template(self, group: str) -> str:
        """An engine job's output: one done file per round (`{token}`, ckpteval.verbs), a name
        no file has when the workflow is parsed."""
        return str(done_path(Path(self.staging_dir(group)), "{token}"))

    @staticmethod
    def log_template(group: str) -> str:
        suffix = f".{group}" if group else ""
        return f"logs/infer/{{run}}/{{ckpt}}{suffix}.{{token}}.log"

    def _staging(self, run: str, ckpt: str, group: str) -> Path:
        return Path(self.staging_dir(group).format(run=run, ckpt=ckpt))

    def group_jobs(self, group: str) -> list[tuple[str, str]]:
        """(task, variant) pairs one engine job of `group` generates."""
        plan = self.plan
        return [(t, v) for t in plan.engine_groups[group] for v in plan.task_variants[t]]

    def group_of(self, task: str) -> str:
        return next(g for g, tasks in self.plan.engine_groups.items() if task in tasks)

    def engine_rule(self, run: str, group: str) -> str:
        """The engine rule that writes `run`'s cells of engine group `group`."""
        backend = self.plan.runs[run].backend
        return infer_rule_name("infer" if backend == "vllm" else "endpoint", group)

    # ---- what each engine job does in this invocation

    @functools.cache  # noqa: B019 - one object per parse: the cache lives as long as the parse
    def _staging_names(self, run: str, ckpt: str) -> tuple[str, ...]:
        """The names in a checkpoint's staging directory (one listing per checkpoint)."""
        try:
            return tuple(os.listdir(self.layout.staging(run, ckpt)))
        except OSError:
            return ()

    @functools.cache  # noqa: B019 - one object per parse
    def cells_and_round(self, run: str, ckpt: str, group: str) -> tuple[Sequence[Any], str]:
        """(cells, round) of a checkpoint's engine job of `group`: the cells it (re)generates,
        read from the files and the verbs, and its round token (ckpteval.verbs)."""
        rule = self.engine_rule(run, group)
        cells = requested(self.fresh, run, ckpt, self.group_jobs(group), self.verbs(), rule)
        return cells, next_round(self._staging_names(run, ckpt), group or "main")

    @functools.cache  # noqa: B019 - one object per parse
    def _regenerates(self, run: str, ckpt: str, group: str) -> frozenset[tuple[str, str]]:
        """(task, variant) of every cell a checkpoint's engine job of `group` (re)generates: a
        set, since every generation job of the checkpoint asks (a scan of the cells per job
        was 1 s of a 300-checkpoint dry run under the profiler)."""
        cells, _ = self.cells_and_round(run, ckpt, group)
        return frozenset((c.key.task, c.key.variant) for c in cells)

    @functools.cache  # noqa: B019 - one object per parse
    def done_file(self, run: str, ckpt: str, group: str) -> str:
        """An engine job's done file, built once per job rather than once per cell that waits
        for it (every generation job of the checkpoint asks)."""
        _, token = self.cells_and_round(run, ckpt, group)
        return str(done_path(self._staging(run, ckpt, group), token))

    def request_file(self, group: str, wildcards: Any) -> str:
        """The request file of an engine job (its rule's params)."""
        staging = self._staging(wildcards.run, wildcards.ckpt, group)
        return str(request_path(staging, wildcards.token))

    def targets(self, runs: Iterable[str]) -> list[str]:
        """The done files of the engine jobs with cells to (re)generate: targets of `all`, so
        that a cell Snakemake would not redo by itself (damaged, made by another model) is
        redone."""
        return [
            self.done_file(run, ckpt.name, group)
            for run in runs
            for ckpt in self.plan.runs[run].checkpoints
            if not ckpt.deleted
            for group in self.plan.engine_groups
            if self.cells_and_round(run, ckpt.name, group)[0]
        ]

    def generation_inputs(self, cell: CellKey) -> dict[str, str]:
        """A cell's generation job reads its model card and, if this invocation (re)generates
        the cell, its engine job's done file: missing, so Snakemake plans the engine job. Any
        other cell has no edge to the engine job: an engine job run for another cell never
        reruns it (an `ancient()` input would not do, since Snakemake only holds back a rerun
        for ancient files that exist)."""
        run, ckpt, group = cell.run, cell.ckpt, self.group_of(cell.task)
        inputs = {"manifest": self.layout.manifest(run, ckpt)}
        if (cell.task, cell.variant) in self._regenerates(run, ckpt, group):
            inputs["done"] = self.done_file(run, ckpt, group)
        return inputs

    def write_requests(self, dag: Any) -> None:
        """When the run starts (onstart: under Snakemake's lock, never in a dry run): the
        request file of every engine job Snakemake will run, which it and its siblings read."""
        for job in dag.needrun_jobs():
            group = self.rules.get(job.rule.name)
            if group is None:
                continue
            run, ckpt = job.wildcards.run, job.wildcards.ckpt
            cells, _ = self.cells_and_round(run, ckpt, group)
            payload = engine_payload(self.plan, run, self.plan.engine_groups[group])
            body = request_body(cells, self.invocation, payload)
            staging = self._staging(run, ckpt, group)
            write_request(request_path(staging, job.wildcards.token), body)
