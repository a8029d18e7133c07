"""The replay backend ("solutions only"): generations that already exist go straight to evaluate.

A replay run names JSONL files of completions (`runs.<name>.solutions`; one file per task and
checkpoint, or a directory per checkpoint with one or more files per task): `{task_id, completion}`
lines (as HumanEval's `samples.jsonl`), or per-sample lines with `sample_idx` and any of
`prompt`, `finish_reason`, `prompt_tokens`, `completion_tokens`. Nothing is generated: no engine,
no GPU lease. Each file is checked against the task before it becomes a generation file:

- a malformed line, a line without a string `completion`, a duplicate (task_id, sample_idx), or a
  task_id the task does not have stops the job with one line naming the file and line;
- task_ids the task has but that lie beyond its `limit` are dropped (a full HumanEval samples
  file serves a `limit: 8` config);
- problems without any line are reported in the log and the meta (`missing_problems`); the
  evaluate step counts them as `problems_without_samples`.

A task with `reasoning` gets its lines split like generated ones (`ckpteval.reasoning.split`),
with the task's stop strings; there is no tokenizer here, so `reasoning_tokens` is null and the
budget is checked only against a line's own `completion_tokens`, for a never-ended reasoning.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckpteval.environment import job_environment, versions
from ckpteval.errors import UserError
from ckpteval.io import sha256_file, write_json, write_jsonl
from ckpteval.plan.layout import generation_meta_of
from ckpteval.problems import numbered_lines
from ckpteval.reasoning import split, task_reasoning
from ckpteval.tasks import TaskSpec

log = logging.getLogger(__name__)

_KEPT = ("prompt", "finish_reason", "prompt_tokens", "completion_tokens")


def replay_solutions(
    sources: Path | Sequence[Path], task: TaskSpec, variant: str, out: Path, *, where: str
) -> dict[str, Any]:
    """Validate `sources` (one file, or a checkpoint's files of `task`) against `task` and write
    them as the generation file `out` (+ meta). Each line keeps the file it came from
    (`source_file`, relative to the files' common directory): the evaluate step reports a cell's
    pass rate per file. Sample indices count on across files, per task_id."""
    started = time.time()
    sources = _checked_sources(sources, task, where)
    root = _common_root(sources)
    problems = task.problems()
    replay = _Replay(task, problems, root)
    for source in sources:
        for lineno, row in numbered_lines(source, "task_id and completion"):
            replay.add(source, lineno, row)
    lines, missing = replay.finished(sources, where)
    write_jsonl(out, lines)
    stats = _meta(task, variant, sources, problems, lines, missing, replay.dropped, started)
    write_json(generation_meta_of(out), stats)
    log.info("replayed %d samples of task %s from %d file(s)", len(lines), task.name, len(sources))
    return stats


def _checked_sources(sources: Path | Sequence[Path], task: TaskSpec, where: str) -> list[Path]:
    """`sources` as a list, or one line saying why a replay of `task` cannot read them."""
    if task.kind != "generate":
        raise UserError(
            f"{where}: task {task.name} is an lm-eval task, scored inside lm-eval "
            "while it generates; replay runs take ckpteval's own tasks only"
        )
    sources = [sources] if isinstance(sources, Path) else list(sources)
    if not sources:
        raise UserError(f"{where}: no solutions files for task {task.name}")
    for source in sources:
        if not source.is_file():
            raise UserError(f"{where}: no solutions file {source} for task {task.name}")
    return sources


def _common_root(sources: list[Path]) -> Path:
    """The directory `source_file` is relative to: the files' common directory."""
    if len(sources) == 1:
        return sources[0].parent
    return Path(os.path.commonpath([str(s.parent) for s in sources]))


class _Replay:
    """The generation lines of a replay, built one solutions line at a time: each checked as it
    comes (one line naming file and line for a mistake), unknown task_ids gathered to be
    reported together, lines beyond the task's `limit` counted and dropped."""

    def __init__(self, task: TaskSpec, problems: dict[str, dict[str, Any]], root: Path) -> None:
        self.task, self.problems, self.root = task, problems, root
        self.reasoning = task_reasoning(task.options)
        self.known = {row["task_id"] for row in task.builtin.load()}
        self.lines: list[dict[str, Any]] = []
        self.seen: set[tuple[str, int]] = set()
        self.next_idx: Counter[str] = Counter()
        self.unknown: list[str] = []
        self.unknown_in: Path | None = None
        self.dropped = 0

    def add(self, source: Path, lineno: int, row: dict[str, Any]) -> None:
        at = f"{source}:{lineno}"
        tid, completion = row.get("task_id"), row.get("completion")
        if not isinstance(tid, str) or not tid:
            raise UserError(f"{at}: no task_id (each line needs task_id and completion)")
        if not isinstance(completion, str):
            raise UserError(f"{at}: completion missing or not a string (task {tid})")
        if tid not in self.known:
            self.unknown.append(f"{tid!r} (line {lineno})")
            self.unknown_in = self.unknown_in or source
            return
        if tid not in self.problems:
            self.dropped += 1
            return
        idx = self._sample_idx(at, tid, row)
        self.lines.append(self._line(source, tid, idx, completion, row))

    def _sample_idx(self, at: str, tid: str, row: dict[str, Any]) -> int:
        """The line's sample index (given, or the next of its task_id), seen only once."""
        idx = row.get("sample_idx", self.next_idx[tid])
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
            raise UserError(f"{at}: sample_idx must be a non-negative integer (task {tid})")
        if (tid, idx) in self.seen:
            raise UserError(
                f"{at}: a second sample {idx} of task {tid}; give each sample its own "
                "sample_idx, or leave sample_idx out to number them in file order"
            )
        self.seen.add((tid, idx))
        self.next_idx[tid] = max(self.next_idx[tid], idx + 1)
        return idx

    def _line(
        self, source: Path, tid: str, idx: int, completion: str, row: dict[str, Any]
    ) -> dict[str, Any]:
        """A generation line, split like a generated one when the task has `reasoning`."""
        task = self.task
        line = {
            "task_id": tid,
            "sample_idx": idx,
            "prompt": task.render(self.problems[tid]),
            "completion": completion,
            "finish_reason": None,
            "prompt_tokens": None,
            "completion_tokens": None,
            "source_file": str(source.relative_to(self.root)),
        }
        line.update({k: row[k] for k in _KEPT if k in row})
        if self.reasoning is not None:
            line.update(
                split(
                    completion,
                    prompt=line["prompt"],
                    cfg=self.reasoning,
                    stops=task.builtin.stop,
                    include_stop=task.builtin.include_stop,
                    engine_finish=line["finish_reason"],
                    count_tokens=lambda _: None,
                    completion_tokens=line["completion_tokens"],
                ).fields()
            )
        return line

    def finished(self, sources: list[Path], where: str) -> tuple[list[dict[str, Any]], list[str]]:
        """(the lines in problem order, the problems without any), or one line for unknown
        task_ids or no samples at all."""
        task, problems = self.task, self.problems
        if self.unknown:
            raise UserError(
                f"{self.unknown_in}: {len(self.unknown)} line(s) name task_ids that task "
                f"{task.name} does not have (first: {self.unknown[0]}); check that "
                f"{where}.solutions maps {{task}} to this task's file"
            )
        if not self.lines:
            raise UserError(
                f"{', '.join(map(str, sources))}: no samples for task {task.name} within its "
                "problems"
            )
        covered = {line["task_id"] for line in self.lines}
        missing = [tid for tid in problems if tid not in covered]
        if missing:
            log.warning(
                "%s: %d of %d problems of task %s have no sample (first: %s)",
                self.root,
                len(missing),
                len(problems),
                task.name,
                missing[0],
            )
        order = {tid: i for i, tid in enumerate(problems)}
        lines = sorted(self.lines, key=lambda line: (order[line["task_id"]], line["sample_idx"]))
        return lines, missing


def _meta(
    task: TaskSpec,
    variant: str,
    sources: list[Path],
    problems: dict[str, dict[str, Any]],
    lines: list[dict[str, Any]],
    missing: list[str],
    dropped: int,
    started: float,
) -> dict[str, Any]:
    """The generation meta of a replay: what a generated one records, with the files' hashes."""
    return {
        "task": task.name,
        "variant": variant,
        "backend": "replay",
        "checker": task.checker,
        "task_hash": task.config_hash(),
        "solutions_file": str(sources[0]),
        "solutions_sha256": sha256_file(sources[0]),
        "solutions_files": [{"path": str(p), "sha256": sha256_file(p)} for p in sources],
        "n_problems": len(problems) - len(missing),
        "n_samples": len(lines),
        "missing_problems": missing,
        "dropped_beyond_limit": dropped,
        "engine_loads": 0,
        "load_seconds": 0.0,
        "n_cached_prompts": 0,
        "n_generated_prompts": 0,
        "started_at": started,
        "finished_at": time.time(),
        "device": job_environment(None),
        "versions": versions(),
    }
