"""Score a file of samples with a checker: self-test, verdicts, cell metrics, both files atomically.

This is the one entry point of the evaluate step, shared by the workflow's evaluate rule and the
standalone `ckpteval score` command.

Files written (the schemas live here):

- `out_jsonl`, one line per scored sample, in input order::

    {"task_id", "sample_idx", "passed": bool, "score": float, "error_type": str | null,
     "compile_ok": bool | null, "duration_s": float, "stderr_tail": str, ...checker extras}

- `out_json`, the cell::

    {"checker", "checker_version", "scorer_version", "sandbox", "n_problems", "n_samples",
     "problems_without_samples", "metrics": {"pass@k": {"value", "stderr", "n"}, ...,
     "compile_rate": {...} (code checkers), "accuracy": {...} (answer checkers)},
     "error_types": {type: count}, "input_errors": [...], "self_test": {...}, "duration_s",
     ...provenance}

  pass@k is reported for every k up to the smallest number of samples of any problem (or the
  requested `ks` that fit); its `n` counts problems. compile_rate and accuracy are means over
  samples, their `n` counts samples.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ckpteval import __version__
from ckpteval.checkers import MAX_COMPLETION_CHARS, Checker, Job, OnVerdicts, Verdict, get_checker
from ckpteval.errors import UserError
from ckpteval.io import append_jsonl, iter_jsonl, sha256_json, write_json, write_jsonl
from ckpteval.metrics import mean_and_stderr, pass_at_k_table

log = logging.getLogger(__name__)

SCORER_VERSION = f"ckpteval-{__version__}"

class SelfTestError(RuntimeError):
    """A checker failed its own self-test: its verdicts cannot be trusted, so nothing is scored."""


def read_samples(path: Path, errors: list[str]) -> Iterator[dict[str, Any]]:
    """Samples of a JSONL file, each tagged with its file and line for later messages.

    Malformed lines (bad JSON, not UTF-8, not an object) are described in `errors` as
    `file:line: problem` and skipped; a file without any line is a `UserError`.
    """
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: samples file not found") from None
    count = 0
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            count += 1
            try:
                row = json.loads(raw.decode("utf-8"))
                if not isinstance(row, dict):
                    raise ValueError("expected a JSON object")
            except (UnicodeDecodeError, ValueError) as exc:
                errors.append(f"{path}:{line_no}: malformed line ({type(exc).__name__}: "
                              f"{str(exc)[:200]})")
                continue
            yield {**row, "_file": str(path), "_line": line_no}
    if count == 0:
        raise UserError(f"{path}: no samples (the file is empty)")


def score_samples(
    checker: str,
    problems: Mapping[str, Mapping[str, Any]],
    samples: Iterable[Mapping[str, Any]],
    out_jsonl: Path,
    out_json: Path,
    *,
    workers: int,
    timeout: float | None = None,
    ks: Sequence[int] | None = None,
    checker_options: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    input_errors: list[str] | None = None,
) -> dict[str, Any]:
    """Self-test `checker`, score `samples` against `problems`, write both files; return the cell.

    Malformed samples (no task_id, unknown task, completion not a string, duplicate sample_idx)
    are listed in the cell's `input_errors` and skipped; a completion over the size limit is scored
    `too_large` and listed too. A failed self-test raises `SelfTestError`; sandbox failures raise.
    """
    start = time.monotonic()
    if not problems:
        raise UserError(f"checker {checker}: no problems to score against")
    samples = list(samples)  # a lazy reader adds its malformed lines to `input_errors` meanwhile
    errors = list(input_errors or [])
    options = dict(checker_options or {})
    impl = get_checker(checker, **options)
    try:
        for task_id, problem in problems.items():
            impl.validate_problem(task_id, problem)
        rows, jobs, preset = _collect(samples, problems, errors)
        if not rows:
            raise UserError(f"checker {checker}: no well-formed samples to score"
                            + (f" ({len(errors)} input errors, first: {errors[0]})" if errors else ""))
        progress = _Progress(Path(out_jsonl), {"checker": checker, "version": impl.version,
                                               "options": options, "timeout": timeout})
        job_rows = [i for i in range(len(rows)) if i not in preset]
        keys = [progress.key(rows[r], job.completion) for r, job in zip(job_rows, jobs)]
        todo = [j for j, key in enumerate(keys) if key not in progress.known]
        # One call for the self-test and the samples: batching checkers fill batches better.
        references, wrong = impl.reference_jobs(problems), impl.known_wrong_jobs(problems)
        listener = progress.listener(len(references), len(wrong), [keys[j] for j in todo])
        checked = impl.check([*references, *wrong, *(jobs[j] for j in todo)], workers=workers,
                             timeout=timeout, on_verdicts=listener)
        split = len(references) + len(wrong)
        try:
            self_test = self_test_report(impl, references, wrong, checked[:split])
        except SelfTestError:
            progress.discard()  # verdicts of a checker that failed its self-test are worthless
            raise
        fresh = dict(zip(todo, checked[split:]))
        by_row = {r: fresh[j] if j in fresh else progress.known[keys[j]] for j, r in enumerate(job_rows)}
        results = [preset.get(i) or by_row[i] for i in range(len(rows))]
        self_test["reused_verdicts"] = len(jobs) - len(todo)
    finally:
        impl.close()
    lines = [{**row, **verdict.record()} for row, verdict in zip(rows, results, strict=True)]
    write_jsonl(out_jsonl, lines)
    cell = {
        "checker": checker,
        "checker_version": impl.version,
        "scorer_version": SCORER_VERSION,
        "sandbox": options.get("sandbox", "bwrap") if impl.compiles else None,
        **cell_metrics(impl, problems, lines, ks),
        "input_errors": errors,
        "self_test": self_test,
        "duration_s": round(time.monotonic() - start, 3),
        **(provenance or {}),
    }
    write_json(out_json, cell)
    progress.discard()
    for message in errors:
        log.warning("input error: %s", message)
    return cell


class _Progress:
    """Verdicts already reached for a cell, kept beside `out_jsonl` (`<name>.partial`) while it is
    scored, so that a run that dies midway (an endpoint going down, a killed job) resumes where it
    stopped. The file is not a declared output, so Snakemake leaves it in place after a failure.

    A verdict is written only once the self-test of the same call has fully passed, and is keyed
    by the sample (task_id, sample_idx, completion hash) and everything that decides its verdict
    (checker, version, options, timeout): a changed setting never reuses an old verdict.
    """

    def __init__(self, out_jsonl: Path, identity: Mapping[str, Any]) -> None:
        self.path = out_jsonl.with_name(out_jsonl.name + ".partial")
        self.identity = sha256_json(identity)
        self.known: dict[str, Verdict] = {}
        if self.path.exists():
            for row in iter_jsonl(self.path, errors=[]):  # a torn last line is skipped
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    self.known[row["key"]] = Verdict(**row["verdict"])

    def key(self, row: Mapping[str, Any], completion: str) -> str:
        return sha256_json([self.identity, row["task_id"], row["sample_idx"],
                            hashlib.sha256(completion.encode("utf-8", "surrogatepass")).hexdigest()])

    def listener(self, n_references: int, n_wrong: int, keys: Sequence[str]) -> OnVerdicts:
        """Persist sample verdicts (job index >= the self-test's) once the self-test passed."""
        split = n_references + n_wrong
        waiting = set(range(split))
        held: list[tuple[int, Verdict]] = []
        lock = threading.Lock()
        state = {"trusted": split == 0, "broken": False}

        def on_verdicts(items: list[tuple[int, Verdict]]) -> None:
            with lock:
                for index, verdict in items:
                    if index < split:
                        waiting.discard(index)
                        if verdict.passed != (index < n_references):
                            state["broken"] = True
                    else:
                        held.append((index, verdict))
                if state["broken"]:
                    return
                if not waiting:
                    state["trusted"] = True
                if state["trusted"] and held:
                    append_jsonl(self.path, [{"key": keys[i - split], "verdict": asdict(v)} for i, v in held])
                    held.clear()

        return on_verdicts

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _collect(
    samples: Iterable[Mapping[str, Any]],
    problems: Mapping[str, Mapping[str, Any]],
    errors: list[str],
) -> tuple[list[dict[str, Any]], list[Job], dict[int, Verdict]]:
    """Validate samples: (output rows, jobs to run, verdicts decided without running by row)."""
    rows: list[dict[str, Any]] = []
    jobs: list[Job] = []
    preset: dict[int, Verdict] = {}
    seen: set[tuple[str, int]] = set()
    next_idx: Counter[str] = Counter()
    for ordinal, sample in enumerate(samples, start=1):
        where = (f"{sample['_file']}:{sample['_line']}" if "_line" in sample
                 else f"sample #{ordinal}")
        task_id, completion = sample.get("task_id"), sample.get("completion")
        if not isinstance(task_id, str) or not task_id:
            errors.append(f"{where}: no task_id")
            continue
        if task_id not in problems:
            errors.append(f"{where}: unknown task_id {task_id!r} (not in the problems)")
            continue
        if not isinstance(completion, str):
            errors.append(f"{where}: completion missing or not a string (task {task_id})")
            continue
        idx = sample.get("sample_idx", next_idx[task_id])
        if not isinstance(idx, int) or isinstance(idx, bool):
            errors.append(f"{where}: sample_idx must be an integer (task {task_id})")
            continue
        next_idx[task_id] = max(next_idx[task_id], idx + 1)
        if (task_id, idx) in seen:
            errors.append(f"{where}: duplicate sample {idx} of task {task_id}; kept the first")
            continue
        seen.add((task_id, idx))
        if len(completion) > MAX_COMPLETION_CHARS:
            errors.append(f"{where}: completion of {len(completion):,} characters exceeds the "
                          f"{MAX_COMPLETION_CHARS:,} limit; scored as too_large (task {task_id})")
            preset[len(rows)] = Verdict(False, "too_large",
                                        stderr_tail=f"completion of {len(completion)} characters")
        else:
            jobs.append(Job(task_id, problems[task_id], completion))
        rows.append({"task_id": task_id, "sample_idx": idx})
    return rows, jobs, preset


def run_self_test(checker: Checker, problems: Mapping[str, Mapping[str, Any]], *, workers: int,
                  timeout: float | None) -> dict[str, Any]:
    """Reference solutions must pass and known-wrong samples must fail, or `SelfTestError`."""
    references, wrong = checker.reference_jobs(problems), checker.known_wrong_jobs(problems)
    verdicts = checker.check([*references, *wrong], workers=workers, timeout=timeout)
    return self_test_report(checker, references, wrong, verdicts)


def self_test_report(checker: Checker, references: Sequence[Job], wrong: Sequence[Job],
                     verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """Judge the self-test's verdicts (references first, then known-wrong); raise if it failed."""
    failed = [(job, v) for job, v in zip(references, verdicts[: len(references)]) if not v.passed]
    passed = [(job, v) for job, v in zip(wrong, verdicts[len(references):]) if v.passed]
    if failed or passed:
        parts = []
        if failed:
            shown = "; ".join(f"{job.task_id}: {v.error_type}: {v.stderr_tail.strip()[-300:]}"
                              for job, v in failed[:3])
            parts.append(f"reference solutions of {len(failed)} of {len(references)} problems did "
                         f"not pass ({shown}); fix or drop those problems, or check the sandbox")
        if passed:
            parts.append(f"{len(passed)} known-wrong samples passed: the checker cannot tell "
                         "right from wrong")
        raise SelfTestError(f"checker {checker.name} self-test failed: " + " | ".join(parts))
    return {"references_passed": len(references), "known_wrong_failed": len(wrong)}


def cell_metrics(checker: Checker, problems: Mapping[str, Any], lines: Sequence[Mapping[str, Any]],
                 ks: Sequence[int] | None) -> dict[str, Any]:
    """pass@k over problems, compile rate / accuracy over samples, error counts."""
    per_task: dict[str, list[bool]] = {}
    for line in lines:
        per_task.setdefault(line["task_id"], []).append(bool(line["passed"]))
    table = pass_at_k_table([(len(v), sum(v)) for v in per_task.values()], ks)
    metrics: dict[str, dict[str, float | int]] = {
        f"pass@{k}": {"value": value, "stderr": stderr, "n": n}
        for k, (value, stderr, n) in sorted(table.items())
    }
    if checker.compiles:
        compiled = [float(line["compile_ok"]) for line in lines if line["compile_ok"] is not None]
        if compiled:
            value, stderr = mean_and_stderr(compiled)
            metrics["compile_rate"] = {"value": value, "stderr": stderr, "n": len(compiled)}
    else:
        value, stderr = mean_and_stderr([float(line["score"]) for line in lines])
        metrics["accuracy"] = {"value": value, "stderr": stderr, "n": len(lines)}
    return {
        "n_problems": len(per_task),
        "n_samples": len(lines),
        "problems_without_samples": len(set(problems) - set(per_task)),
        "metrics": metrics,
        "error_types": dict(sorted(Counter(line["error_type"] for line in lines
                                           if line["error_type"]).items())),
    }
