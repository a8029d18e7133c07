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

from ckpteval.errors import UserError
from ckpteval.io import sha256_file, write_json, write_jsonl
from ckpteval.problems import numbered_lines
from ckpteval.reasoning import split, task_reasoning
from ckpteval.tasks import TaskSpec

log = logging.getLogger(__name__)

_KEPT = ("prompt", "finish_reason", "prompt_tokens", "completion_tokens")


def replay_solutions(  # noqa: C901 - infer-side code under concurrent change; split it there
    sources: Path | Sequence[Path], task: TaskSpec, variant: str, out: Path, *, where: str
) -> dict[str, Any]:
    """Validate `sources` (one file, or a checkpoint's files of `task`) against `task` and write
    them as the generation file `out` (+ meta). Each line keeps the file it came from
    (`source_file`, relative to the files' common directory): the evaluate step reports a cell's
    pass rate per file. Sample indices count on across files, per task_id."""
    from ckpteval.infer import job_environment, versions

    started = time.time()
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
    root = (
        sources[0].parent
        if len(sources) == 1
        else Path(os.path.commonpath([str(s.parent) for s in sources]))
    )
    problems = task.problems()
    reasoning = task_reasoning(task.options)
    known = {row["task_id"] for row in task.builtin.load()}
    lines: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    next_idx: Counter[str] = Counter()
    unknown: list[str] = []
    unknown_in: Path | None = None
    dropped = 0
    for source, lineno, row in (
        (s, n, r) for s in sources for n, r in numbered_lines(s, "task_id and completion")
    ):
        at = f"{source}:{lineno}"
        tid, completion = row.get("task_id"), row.get("completion")
        if not isinstance(tid, str) or not tid:
            raise UserError(f"{at}: no task_id (each line needs task_id and completion)")
        if not isinstance(completion, str):
            raise UserError(f"{at}: completion missing or not a string (task {tid})")
        if tid not in known:
            unknown.append(f"{tid!r} (line {lineno})")
            unknown_in = unknown_in or source
            continue
        if tid not in problems:
            dropped += 1
            continue
        idx = row.get("sample_idx", next_idx[tid])
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
            raise UserError(f"{at}: sample_idx must be a non-negative integer (task {tid})")
        if (tid, idx) in seen:
            raise UserError(
                f"{at}: a second sample {idx} of task {tid}; give each sample its own "
                "sample_idx, or leave sample_idx out to number them in file order"
            )
        seen.add((tid, idx))
        next_idx[tid] = max(next_idx[tid], idx + 1)
        line = {
            "task_id": tid,
            "sample_idx": idx,
            "prompt": task.render(problems[tid]),
            "completion": completion,
            "finish_reason": None,
            "prompt_tokens": None,
            "completion_tokens": None,
            "source_file": str(source.relative_to(root)),
        }
        line.update({k: row[k] for k in _KEPT if k in row})
        if reasoning is not None:
            line.update(
                split(
                    completion,
                    prompt=line["prompt"],
                    cfg=reasoning,
                    stops=task.builtin.stop,
                    include_stop=task.builtin.include_stop,
                    engine_finish=line["finish_reason"],
                    count_tokens=lambda _: None,
                    completion_tokens=line["completion_tokens"],
                ).fields()
            )
        lines.append(line)
    if unknown:
        raise UserError(
            f"{unknown_in}: {len(unknown)} line(s) name task_ids that task {task.name} does not have "
            f"(first: {unknown[0]}); check that {where}.solutions maps {{task}} to this task's file"
        )
    if not lines:
        raise UserError(
            f"{', '.join(map(str, sources))}: no samples for task {task.name} within its problems"
        )
    covered = {line["task_id"] for line in lines}
    missing = [tid for tid in problems if tid not in covered]
    if missing:
        log.warning(
            "%s: %d of %d problems of task %s have no sample (first: %s)",
            root,
            len(missing),
            len(problems),
            task.name,
            missing[0],
        )
    order = {tid: i for i, tid in enumerate(problems)}
    lines.sort(key=lambda line: (order[line["task_id"]], line["sample_idx"]))
    write_jsonl(out, lines)
    stats = {
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
    write_json(out.with_suffix(".meta.json"), stats)
    log.info("replayed %d samples of task %s from %d file(s)", len(lines), task.name, len(sources))
    return stats
