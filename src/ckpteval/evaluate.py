"""Score a file of samples with a checker: self-test, verdicts, cell metrics, both files atomically.

This is the one entry point of the evaluate step, shared by the workflow's evaluate rule and the
standalone `ckpteval score` command. It streams: samples are read, checked (up to `CHUNK_SIZE`
at once, through `Checker.check_stream`) and written as they come, so its memory does not grow
with the samples file.

Files written (the schemas live here):

- `out_jsonl`, one line per scored sample, in input order::

    {"task_id", "sample_idx", "passed": bool, "score": float, "error_type": str | null,
     "compile_ok": bool | null, "duration_s": float, "stderr_tail": str,
     "hack": str | null (one of `ckpteval.checkers.HACK_TYPES`), ...checker extras,
     "source_file": str (replayed samples: the solutions file the sample came from)}

- `out_json`, the cell::

    {"checker", "checker_version", "scorer_version", "sandbox", "sandbox_mode" (bwrap: root or
     rootless), "sandbox_uncounted" (bwrap: what its limits miss on this host, or null),
     "n_problems", "n_samples", "problems_without_samples", "metrics": {"pass@k": {"value", "stderr", "n"}, ...,
     "compile_rate": {...} (code checkers), "accuracy": {...} (answer checkers),
     "hack_rate": {...}, ...length metrics}, "error_types": {type: count}, "hack_types": {hack: count}, "input_errors": [...], "self_test": {...},
     "timeouts": {"configured": float, "factor": float, "calibrated_problems": int,
                  "max_s": float, "median_s": float},
     "per_file": {source_file: {"n_samples", "n_passed", "n_problems", "pass_rate"}} (replay),
     "python_env": {"site_packages", "python", "packages": ["name==version", ...]} (python
     cells with `evaluate.python_env`), "duration_s", ...provenance}

  pass@k is reported for every k up to the smallest number of samples of any problem (or the
  requested `ks` that fit); its `n` counts problems. compile_rate, accuracy and hack_rate (the
  share of samples whose verdict records a reward hack) are means over samples, their `n` counts
  samples. stdio cells add `official_tests_pass_rate` (samples whose official tests all passed)
  and `generated_tests_pass_rate` (samples whose generated tests all passed, over the samples
  whose generated tests ran), means over samples. `timeouts` says where the run timeouts came
  from: the configured timeout (the checker's default if none was given), the calibration
  factor, how many problems got a longer timeout from their reference solution's run time, and
  the largest and median timeout over the problems (`calibrate_timeouts`).

  Reward-function cells (`ckpteval.checkers.reward`) add, each number stating what it does with
  the errored samples (`ckpteval.errored` words it):
  `reward_error_rate` (the share of samples with no score: the function raised, hung or returned
  no finite number, or the sample was too large or its reasoning never ended; `n` counts every
  sample), `reward_mean` and `acc` (the mean of a numeric or boolean `acc` key the function
  returned, a [0, 1] value). Where the scores' range is known (every score a bool, `acc`, or the
  task's `reward_range: [lo, hi]`), an errored sample counts in `n` at the bottom of the range,
  and the entry adds `includes_errors` (how many), `errors_at: [lo, hi]` and `interval`: from the
  mean with them at `lo` minus its margin to the mean with them at `hi` plus its margin, within
  [lo, hi]. Where it is not known, the mean is over the scored samples and `excludes_errors` says
  how many it leaves out. The per-source metrics do the same with their source's samples.
  `reward_distribution`: {"min", "p10", "p25", "p50", "p75", "p90", "max", "n"} of the scores,
  plus "counts" {score: samples} when there are at most `DISTRIBUTION_VALUES` distinct scores.
  Their score lines carry `reward`, `reward_info` (the dict's other keys) and `reward_type:
  "bool"` for a bool; the dict's other numeric keys (verl's `reward_extra_info`, up to
  `EXTRA_KEYS`) are averaged into `reward_extra/<key>` over the samples that return them. A
  reward cell names `reward_mean` its `primary_metric` (the task's headline in the overview, the
  tables and `compare`) and reports no `accuracy` (its mean score: the same number, another
  denominator). A checker whose self-test is off records why (`self_test.off`).

  Length metrics (`ckpteval.metrics.LENGTH_METRICS`, `LengthTotals`) come from the generation
  lines' own fields, over the scored samples that state them: `completion_tokens_mean`,
  `completion_tokens_median` (from `completion_tokens`), `truncation_rate` (share with
  `finish_reason` "length"), and for lines with reasoning `reasoning_tokens_mean` and
  `truncated_reasoning_rate`. A sample whose line leaves a field null or out (replay, some
  endpoints) is not in that metric's `n`; a cell without any has no such metric.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import math
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ckpteval import __version__
from ckpteval.checkers import MAX_COMPLETION_CHARS, Checker, Job, OnVerdicts, Verdict, get_checker
from ckpteval.errors import UserError
from ckpteval.io import append_jsonl, iter_jsonl, sha256_json, write_json, write_jsonl
from ckpteval.metrics import LengthTotals, RunningMean, pass_at_k_table
from ckpteval.reasoning import TRUNCATED
from ckpteval.sandbox import isolation

log = logging.getLogger(__name__)

SCORER_VERSION = f"ckpteval-{__version__}"

#: What a score cell holds, as a number bumped whenever cells gain or change metrics (2: the
#: length and truncation metrics). It is part of every cell's scoring identity
#: (ckpteval.contract.scoring_identity), so cells written by an older ckpteval are rescored once,
#: on CPU, instead of lacking metrics that newer cells have.
CELL_FORMAT = 2

#: Samples being checked at once (`Checker.check_stream`'s window; for a checker that does not
#: stream, samples per `Checker.check` call): what bounds the scorer's memory for completions,
#: large enough that batching checkers (rust, python) still fill their batches.
CHUNK_SIZE = 1024
#: The window also closes once its completions add up to this many characters (long degenerate
#: completions: 1,024 of up to `MAX_COMPLETION_CHARS` each would be gigabytes).
CHUNK_CHARS = 32 << 20
#: Verdicts that may wait for the verdict of an earlier, slow sample, in chunks: enough that the
#: other workers go on while a sample runs into its timeout (a few seconds of the whole machine's
#: work), few enough to hold (a verdict is at most its 2,000-character stderr tail and extras).
REORDER_CHUNKS = 8

#: A reward cell averages at most this many of the dict's other numeric keys (verl's
#: `reward_extra_info`), each a metric `EXTRA_PREFIX<key>` over the samples that return it.
EXTRA_KEYS = 20
EXTRA_PREFIX = "reward_extra/"
#: The normal quantile of a two-sided 95% interval (a reward mean's `interval`).
Z_95 = 1.959963984540054
#: A reward distribution lists its scores' counts when it has at most this many distinct ones.
DISTRIBUTION_VALUES = 20

#: A problem's timeout is at least this many times its reference solution's run time.
DEFAULT_TIMEOUT_FACTOR = 5.0


class SelfTestError(UserError):
    """A checker failed its own self-test: its verdicts cannot be trusted, so nothing is scored.
    One line (a `UserError`: no traceback), naming the checker, the rows and what to do."""


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
                errors.append(
                    f"{path}:{line_no}: malformed line ({type(exc).__name__}: {str(exc)[:200]})"
                )
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
    timeout_factor: float = DEFAULT_TIMEOUT_FACTOR,
    ks: Sequence[int] | None = None,
    checker_options: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    input_errors: list[str] | None = None,
    chunk_size: int = CHUNK_SIZE,
    passed_self_test: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Self-test `checker`, score `samples` against `problems`, write both files; return the cell.

    `passed_self_test`, when given, is the verdict of a self-test already passed with these settings
    (`{"self_test": report, "run_s": {task_id: reference run seconds}}`, what the workflow's
    self-test job records: ckpteval.selftest): the checker is not self-tested again, and the
    timeouts are calibrated from the recorded run times.

    `samples` is consumed lazily, once: a reader such as `read_samples` may keep appending its
    malformed lines to `input_errors` meanwhile; they all end up in the cell. Malformed samples
    (no task_id, unknown task, completion not a string, bad or duplicate sample_idx) are listed in
    the cell's `input_errors` and skipped; a completion over the size limit is scored `too_large`
    and listed too. A sample with an `answer` (a reasoning task) is scored on it, and one with
    `truncated_reasoning: true` is failed as `truncated_reasoning` unchecked. A failed self-test raises `SelfTestError` before anything is written; sandbox
    failures raise.

    Memory does not grow with the number of samples (beyond one bit each for the compile rate or
    accuracy, the token counts of the length metrics (`LengthTotals`: 8 bytes a sample), the input
    error messages, and the sample indices that arrive out of order): at most
    `chunk_size` samples (or the checker's `window_per_worker` times the workers, if more: a
    reward batch is worth starting full) are being checked at once (`REORDER_CHUNKS` times as
    many verdicts may wait for a slow one), lines are appended to a temp file beside `out_jsonl`
    that is renamed into place once every sample is scored, and the cell's metrics are kept as
    running counts.

    Each problem's run timeout is `max(configured, timeout_factor x its reference solution's run
    time in the self-test)` (`calibrate_timeouts`), so a correct but slowish sample on a busy
    machine does not time out; `timeout_factor=0` keeps the configured timeout everywhere.
    """
    start = time.monotonic()
    if not problems:
        raise UserError(f"checker {checker}: no problems to score against")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    read_errors = input_errors if input_errors is not None else []
    invalid: list[str] = []  # found here; listed after the reader's, as when samples were a list
    options = dict(checker_options or {})
    impl = get_checker(checker, **options)
    try:
        totals, self_test, timeouts, progress = _score_into(
            impl,
            problems,
            samples,
            Path(out_jsonl),
            [read_errors, invalid],
            options,
            workers=workers,
            timeout=timeout,
            timeout_factor=timeout_factor,
            chunk_size=chunk_size,
            passed=passed_self_test,
        )
    finally:
        impl.close()
    errors = [*read_errors, *invalid]
    cell = {
        "checker": checker,
        "checker_version": impl.version,
        "scorer_version": SCORER_VERSION,
        **isolation(_sandbox_mode(impl, options)),
        **impl.cell_fields(),
        **totals.cell_metrics(problems, ks),
        "input_errors": errors,
        "self_test": self_test,
        "timeouts": timeouts.report,
        "duration_s": round(time.monotonic() - start, 3),
        **(provenance or {}),
    }
    write_json(out_json, cell)
    progress.discard()
    for message in errors:
        log.warning("input error: %s", message)
    return cell


def _score_into(
    impl: Checker,
    problems: Mapping[str, Mapping[str, Any]],
    samples: Iterable[Mapping[str, Any]],
    out_jsonl: Path,
    error_lists: list[list[str]],
    options: Mapping[str, Any],
    *,
    workers: int,
    timeout: float | None,
    timeout_factor: float,
    chunk_size: int,
    passed: Mapping[str, Any] | None,
) -> tuple[_CellTotals, dict[str, Any], Timeouts, _Progress]:
    """`score_samples`' work between building the checker and writing the cell: validate the
    problems, self-test (unless `passed` is the verdict of one already passed), write the score
    lines; the samples' input errors are appended to the second of `error_lists` (the reader's
    are the first). The verdicts' progress file is returned for the caller to discard once the
    cell is written."""
    read_errors, invalid = error_lists
    for task_id, problem in problems.items():
        impl.validate_problem(task_id, problem)
    rows = _accepted(samples, problems, invalid)
    first = next(rows, None)
    if first is None:
        errors = [*read_errors, *invalid]
        raise UserError(
            f"checker {impl.name}: no well-formed samples to score"
            + (f" ({len(errors)} input errors, first: {errors[0]})" if errors else "")
        )
    progress = _Progress(
        out_jsonl,
        {
            "checker": impl.name,
            "version": impl.version,
            "options": dict(options),
            "timeout": timeout,
            "timeout_factor": timeout_factor,
        },
    )
    if passed is not None:  # the self-test job's verdict (ckpteval.selftest): no second run
        self_test = dict(passed["self_test"])
        timeouts = timeouts_from(impl, problems, timeout, timeout_factor, passed["run_s"])
    else:
        try:
            self_test, timeouts, _ = run_self_test(
                impl, problems, workers=workers, timeout=timeout, timeout_factor=timeout_factor
            )
        except SelfTestError:
            progress.discard()  # verdicts of a checker that failed its self-test are worthless
            raise
    rewards = getattr(impl, "scores_rewards", False)
    totals = _CellTotals(
        impl.compiles,
        rewards,
        getattr(impl, "reward_range", None),
        data_sources(problems) if rewards else None,
    )
    lines = _scored_lines(
        impl,
        itertools.chain([first], rows),
        progress,
        timeouts,
        totals,
        workers=workers,
        timeout=timeout,
        chunk_size=chunk_size,
    )
    write_jsonl(out_jsonl, lines)
    self_test["reused_verdicts"] = totals.reused
    return totals, self_test, timeouts, progress


def _sandbox_mode(impl: Checker, options: Mapping[str, Any]) -> str | None:
    """Where the checker ran samples: a code checker's configured mode, another checker's own
    sandbox's ("none" for a trusted reward function), or None for one that runs no code."""
    if impl.compiles:
        return str(options.get("sandbox", "bwrap"))
    sandbox = getattr(impl, "sandbox", None)
    mode = getattr(sandbox, "mode", None)
    return mode if isinstance(mode, str) else None


def _scored_lines(
    impl: Checker,
    rows: Iterable[_Row],
    progress: _Progress,
    timeouts: Timeouts,
    totals: _CellTotals,
    *,
    workers: int,
    timeout: float | None,
    chunk_size: int,
) -> Iterator[dict[str, Any]]:
    """The output lines of `rows`, in order, through one `Checker.check_stream` (`chunk_size`
    jobs at a time in its window; verdicts of an earlier, interrupted run of the same cell are
    reused); each line is added to `totals`."""
    waiting: deque[tuple[int, str, int, str | None]] = deque()  # read, not yet out
    keys: dict[int, str] = {}  # progress key of each waiting job, by index

    def items() -> Iterator[Job | Verdict]:
        for index, row in enumerate(rows):
            waiting.append((index, row.task_id, row.sample_idx, row.source_file))
            totals.lengths.add(row.lengths)
            if row.job is None:
                yield row.preset  # type: ignore[misc]
                continue
            key = progress.key(row.task_id, row.sample_idx, row.job.completion)
            known = progress.known.pop(key, None)
            if known is not None:
                totals.reused += 1
                yield known
            else:
                keys[index] = key
                yield timeouts.apply(row.job)

    window = max(chunk_size, impl.window_per_worker * max(1, workers))  # full batches
    for verdict in impl.check_stream(
        items(),
        workers=workers,
        timeout=timeout,
        on_verdicts=progress.listener(keys),
        window=window,
        window_chars=CHUNK_CHARS,
        buffer=REORDER_CHUNKS * window,
    ):
        index, task_id, sample_idx, source_file = waiting.popleft()
        keys.pop(index, None)
        line = {"task_id": task_id, "sample_idx": sample_idx, **verdict.record()}
        if source_file is not None:
            line["source_file"] = source_file
        totals.add(line)
        yield line


class _CellTotals:
    """What a cell's metrics need of its lines, kept as running counts: per-problem (samples,
    passed) in order of first appearance, compile, score and hack means (`RunningMean`), error and
    hack counts."""

    def __init__(
        self,
        compiles: bool,
        rewards: bool = False,
        reward_range: Sequence[float] | None = None,
        sources: Mapping[str, str] | None = None,
    ) -> None:
        self.compiles = compiles
        self.per_task: dict[str, list[int]] = {}
        self.compiled = RunningMean()
        self.scores = RunningMean()
        self.errors: Counter[str] = Counter()
        self.hacked = RunningMean()
        self.hacks: Counter[str] = Counter()
        self.n_samples = 0
        self.reused = 0
        #: stdio: means of `official_passed` / `generated_passed` over the samples that say.
        self.test_sets = {"official": RunningMean(), "generated": RunningMean()}
        #: replayed samples by `source_file`: [samples, passed, problems seen].
        self.per_file: dict[str, list[Any]] = {}
        #: the length metrics, from the samples' generation lines (`_Row.lengths`).
        self.lengths = LengthTotals()
        self.rewards = RewardTotals(rewards, reward_range, sources)

    def add(self, line: Mapping[str, Any]) -> None:
        self.rewards.add(line)
        for name, mean in self.test_sets.items():
            if line.get(f"{name}_passed") is not None:
                mean.add(float(line[f"{name}_passed"]))
        if line.get("source_file") is not None:
            entry = self.per_file.setdefault(line["source_file"], [0, 0, set()])
            entry[0] += 1
            entry[1] += bool(line["passed"])
            entry[2].add(line["task_id"])
        counts = self.per_task.setdefault(line["task_id"], [0, 0])
        counts[0] += 1
        counts[1] += bool(line["passed"])
        if self.compiles:
            if line["compile_ok"] is not None:
                self.compiled.add(float(line["compile_ok"]))
        else:
            self.scores.add(float(line["score"]))
        if line["error_type"]:
            self.errors[line["error_type"]] += 1
        hack = line.get("hack")
        self.hacked.add(1.0 if hack else 0.0)
        if hack:
            self.hacks[hack] += 1
        self.n_samples += 1

    def cell_metrics(self, problems: Mapping[str, Any], ks: Sequence[int] | None) -> dict[str, Any]:
        """pass@k over problems, compile rate / accuracy over samples, error counts."""
        table = pass_at_k_table([(n, c) for n, c in self.per_task.values()], ks)
        metrics: dict[str, dict[str, float | int]] = {
            f"pass@{k}": {"value": value, "stderr": stderr, "n": n}
            for k, (value, stderr, n) in sorted(table.items())
        }
        if self.compiles:
            if self.compiled.n:
                value, stderr = self.compiled.result()
                metrics["compile_rate"] = {"value": value, "stderr": stderr, "n": self.compiled.n}
        elif not self.rewards.enabled:  # a reward cell's mean score is its reward_mean
            value, stderr = self.scores.result()
            metrics["accuracy"] = {"value": value, "stderr": stderr, "n": self.scores.n}
        if self.hacked.n:
            value, stderr = self.hacked.result()
            metrics["hack_rate"] = {"value": value, "stderr": stderr, "n": self.hacked.n}
        for name, mean in self.test_sets.items():
            if mean.n:
                value, stderr = mean.result()
                metrics[f"{name}_tests_pass_rate"] = {"value": value, "stderr": stderr, "n": mean.n}
        metrics.update(self.lengths.metrics())
        metrics.update(self.rewards.metrics())
        extra: dict[str, Any] = self.rewards.distribution()
        if self.per_file:
            extra["per_file"] = {
                name: {
                    "n_samples": n,
                    "n_passed": passed,
                    "n_problems": len(tids),
                    "pass_rate": passed / n if n else 0.0,
                }
                for name, (n, passed, tids) in sorted(self.per_file.items())
            }
        if "reward_mean" in metrics:
            extra["primary_metric"] = "reward_mean"  # the headline of a reward task
        return {
            **extra,
            "n_problems": len(self.per_task),
            "n_samples": self.n_samples,
            "problems_without_samples": len(set(problems) - set(self.per_task)),
            "metrics": metrics,
            "error_types": dict(sorted(self.errors.items())),
            "hack_types": dict(sorted(self.hacks.items())),
        }


class RewardTotals:
    """A reward-function cell's reward metrics (see the module's docstring: each says what it
    does with errored samples): the scores of the lines that carry a `reward` (8 bytes a sample, for the
    distribution's quantiles), how many lines carry none (the function raised, hung or returned
    no number; the sample was too large or its reasoning never ended), whether every score was a
    bool, and the `acc` values. `reward_range` is the declared range of the scores, if any."""

    def __init__(
        self,
        enabled: bool = False,
        reward_range: Sequence[float] | None = None,
        sources: Mapping[str, str] | None = None,
    ) -> None:
        self.enabled = enabled
        self.range = tuple(float(v) for v in reward_range) if reward_range else None
        #: task_id -> its row's `data_source`, and per source (scores, unscored, samples per
        #: problem) for `per_source`
        self.sources = dict(sources or {})
        self.by_source: dict[str, tuple[list[float], list[int], Counter[str]]] = {}
        self.scores: list[float] = []
        self.unscored = 0
        self.all_bool = True
        self.acc: list[float] = []
        #: the dict's other numeric keys (verl's reward_extra_info), at most `EXTRA_KEYS` of them
        self.extra: dict[str, RunningMean] = {}

    def add(self, line: Mapping[str, Any]) -> None:
        reward = line.get("reward")
        scored = isinstance(reward, (int, float)) and not isinstance(reward, bool)
        source = self.sources.get(line.get("task_id", "")) if self.enabled else None
        if source:
            values, unscored, per_problem = self.by_source.setdefault(source, ([], [0], Counter()))
            per_problem[line["task_id"]] += 1
            if scored:
                values.append(float(reward))
            else:
                unscored[0] += 1
        if scored:
            self.scores.append(float(reward))
            self.all_bool = self.all_bool and line.get("reward_type") == "bool"
            info = line.get("reward_info") or {}
            acc = info.get("acc")
            if isinstance(acc, (bool, int, float)):
                self.acc.append(float(acc))
            for key, value in info.items():
                if key != "acc" and _finite(value):
                    if key in self.extra or len(self.extra) < EXTRA_KEYS:
                        self.extra.setdefault(key, RunningMean()).add(float(value))
        elif self.enabled:
            self.unscored += 1

    def known_range(self) -> tuple[float, float] | None:
        """The scores' range: declared (`reward_range`), or [0, 1] when every one was a bool."""
        if self.range is not None:
            return (self.range[0], self.range[1])
        return (0.0, 1.0) if self.scores and self.all_bool else None

    def metrics(self) -> dict[str, dict[str, Any]]:
        """`reward_mean` over every sample (an errored one at the bottom of a known range, the
        interval reaching its top; over the scored ones, saying so, when the range is unknown),
        `reward_error_rate`, and `acc` (a [0, 1] value: errored samples as for a known range)."""
        if not self.enabled or not (self.scores or self.unscored):
            return {}
        n = len(self.scores) + self.unscored
        rate = RunningMean()
        for failed in itertools.chain([0.0] * len(self.scores), [1.0] * self.unscored):
            rate.add(failed)
        value, stderr = rate.result()
        out: dict[str, dict[str, Any]] = {
            "reward_error_rate": {"value": value, "stderr": stderr, "n": n}
        }
        if self.scores:
            out["reward_mean"] = bounded_mean(self.scores, self.unscored, self.known_range())
        if self.acc:
            out["acc"] = bounded_mean(self.acc, self.unscored, (0.0, 1.0))
        for key, mean in self.extra.items():
            value, stderr = mean.result()
            out[f"{EXTRA_PREFIX}{key}"] = {"value": value, "stderr": stderr, "n": mean.n}
        out.update(self.per_source())
        return out

    def per_source(self) -> dict[str, dict[str, Any]]:
        """Each data source's reward, named as verl names its validation metric:
        `val-core/<data_source>/reward/mean@<N>`, N the samples per problem (the most of any
        of the source's problems), errored samples counted as in `reward_mean`."""
        out: dict[str, dict[str, Any]] = {}
        bounds = self.known_range()
        for source, (values, unscored, per_problem) in sorted(self.by_source.items()):
            if values:
                n = max(per_problem.values())
                out[f"val-core/{source}/reward/mean@{n}"] = bounded_mean(
                    values, unscored[0], bounds
                )
        return out

    def distribution(self) -> dict[str, Any]:
        """{"reward_distribution": ...} (see the module's docstring), or {} without rewards
        (over the scored samples: an errored one has no score to place)."""
        if not self.scores:
            return {}
        ordered = sorted(self.scores)

        def at(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        out: dict[str, Any] = {"min": ordered[0], "max": ordered[-1], "n": len(ordered)}
        out.update({f"p{int(q * 100)}": at(q) for q in (0.1, 0.25, 0.5, 0.75, 0.9)})
        counts = Counter(ordered)
        if len(counts) <= DISTRIBUTION_VALUES:
            out["counts"] = {repr(score): n for score, n in sorted(counts.items())}
        return {"reward_distribution": out}


def data_sources(problems: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """task_id -> its row's `data_source` (verl's: `openai/gsm8k`), for the problems that
    name one."""
    return {
        tid: p["data_source"]
        for tid, p in problems.items()
        if isinstance(p.get("data_source"), str) and p["data_source"].strip()
    }


def _finite(value: Any) -> bool:
    """A bool or a finite number a float holds (an int too large for one is not)."""
    if isinstance(value, int):
        return abs(value) < 2**1023
    return isinstance(value, float) and math.isfinite(value)


def bounded_mean(
    values: Sequence[float], errored: int, bounds: tuple[float, float] | None
) -> dict[str, Any]:
    """A mean with `errored` samples that have no value: with `bounds` (lo, hi) known, they
    count in `n` at `lo` (the mean never flatters), `includes_errors` says how many, and the
    `interval` (95%, within the range) reaches from the mean with them at `lo` to the mean with
    them at `hi`; unknown, the mean is over `values` alone, and `excludes_errors` says how many it
    leaves out. Either count is what `ckpteval.errored` words every errored number with."""
    z = Z_95
    if not errored or bounds is None:
        mean = RunningMean()
        for value in values:
            mean.add(value)
        value, stderr = mean.result()
        out: dict[str, Any] = {"value": value, "stderr": stderr, "n": mean.n}
        if errored:
            out["excludes_errors"] = errored
        return out
    ends = []
    for end in bounds:
        mean = RunningMean()
        for value in itertools.chain(values, [end] * errored):
            mean.add(value)
        ends.append(mean.result())
    (low, low_se), (high, high_se) = ends
    return {
        "value": low,
        "stderr": low_se,
        "n": len(values) + errored,
        "includes_errors": errored,
        "errors_at": list(bounds),
        "interval": [max(bounds[0], low - z * low_se), min(bounds[1], high + z * high_se)],
    }


class _Progress:
    """Verdicts already reached for a cell, kept beside `out_jsonl` (`<name>.partial`) while it is
    scored, so that a run that dies midway (an endpoint going down, a killed job) resumes where it
    stopped. The file is not a declared output, so Snakemake leaves it in place after a failure.

    Sample verdicts are written only once the self-test of the same call has fully passed (samples
    are checked after it), and are keyed by the sample (task_id, sample_idx, completion hash) and
    everything that decides its verdict (checker, version, options, timeout, timeout factor): a
    changed setting never reuses an old verdict.
    """

    def __init__(self, out_jsonl: Path, identity: Mapping[str, Any]) -> None:
        self.path = out_jsonl.with_name(out_jsonl.name + ".partial")
        self.identity = sha256_json(identity)
        self.known: dict[str, Verdict] = {}
        if self.path.exists():
            for row in iter_jsonl(self.path, errors=[]):  # a torn last line is skipped
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    self.known[row["key"]] = Verdict(**row["verdict"])

    def key(self, task_id: str, sample_idx: int, completion: str) -> str:
        return sha256_json(
            [
                self.identity,
                task_id,
                sample_idx,
                hashlib.sha256(completion.encode("utf-8", "surrogatepass")).hexdigest(),
            ]
        )

    def listener(self, keys: Mapping[int, str]) -> OnVerdicts:
        """Persist the verdicts of a stream whose item `i`, if checked, is the sample keyed
        `keys[i]`."""
        lock = threading.Lock()

        def on_verdicts(items: list[tuple[int, Verdict]]) -> None:
            with lock:
                append_jsonl(self.path, [{"key": keys[i], "verdict": asdict(v)} for i, v in items])

        return on_verdicts

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


#: Fields of a generation line that the length metrics read (`ckpteval.metrics.LengthTotals`).
LENGTH_FIELDS = ("finish_reason", "completion_tokens", "reasoning_tokens", "truncated_reasoning")


@dataclass(frozen=True)
class _Row:
    """One accepted sample: its job, or the verdict it gets without running (`preset`)."""

    task_id: str
    sample_idx: int
    job: Job | None
    preset: Verdict | None = None
    #: The replayed file the sample came from (a replay run's generation line), kept on its
    #: scored line and counted in the cell's `per_file`.
    source_file: str | None = None
    #: The generation line's length fields (`LENGTH_FIELDS`), for the cell's length metrics.
    lengths: Mapping[str, Any] = field(default_factory=dict)


def scored_text(sample: Mapping[str, Any]) -> Any:
    """What a sample is scored on: its `answer` when it is a reasoning task's line (it carries
    a boolean `truncated_reasoning`, as ckpteval.reasoning writes it), else its `completion`.
    An `answer` field alone is not enough: samples files from other tools often carry the gold
    answer under that name, and scoring it would pass every sample."""
    if isinstance(sample.get("truncated_reasoning"), bool) and "answer" in sample:
        return sample["answer"]
    return sample.get("completion")


def _accepted(
    samples: Iterable[Mapping[str, Any]],
    problems: Mapping[str, Mapping[str, Any]],
    errors: list[str],
) -> Iterator[_Row]:
    """The samples that can be scored, validated as they are read; the others are described in
    `errors` and skipped. A line of a reasoning task is scored on its `answer` (the text after
    its reasoning, ckpteval.reasoning), and one whose reasoning never ended is a
    `truncated_reasoning` failure without running the checker."""
    seen = _SeenIndices()
    next_idx: Counter[str] = Counter()
    for ordinal, sample in enumerate(samples, start=1):
        where = (
            f"{sample['_file']}:{sample['_line']}" if "_line" in sample else f"sample #{ordinal}"
        )
        task_id, completion = sample.get("task_id"), scored_text(sample)
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
        source = sample.get("source_file") if isinstance(sample.get("source_file"), str) else None
        lengths = {name: sample[name] for name in LENGTH_FIELDS if name in sample}
        if not seen.add(task_id, idx):
            errors.append(f"{where}: duplicate sample {idx} of task {task_id}; kept the first")
            continue
        if sample.get("truncated_reasoning") is True:
            yield _Row(
                task_id,
                idx,
                None,
                Verdict(
                    False,
                    TRUNCATED,
                    stderr_tail=f"reasoning not ended ({sample.get('reasoning_tokens')} tokens)",
                ),
                source,
                lengths,
            )
        elif len(completion) > MAX_COMPLETION_CHARS:
            errors.append(
                f"{where}: completion of {len(completion):,} characters exceeds the "
                f"{MAX_COMPLETION_CHARS:,} limit; scored as too_large (task {task_id})"
            )
            yield _Row(
                task_id,
                idx,
                None,
                Verdict(
                    False, "too_large", stderr_tail=f"completion of {len(completion)} characters"
                ),
                source,
                lengths,
            )
        else:
            yield _Row(
                task_id, idx, Job(task_id, problems[task_id], completion), None, source, lengths
            )


class _SeenIndices:
    """The sample indices seen so far, per task: every index below a watermark, and a set of the
    others. Samples arriving in order (0, 1, 2, ... per task) cost nothing per sample."""

    def __init__(self) -> None:
        self.watermark: dict[str, int] = {}
        self.others: dict[str, set[int]] = {}

    def add(self, task_id: str, idx: int) -> bool:
        """Record `idx` of `task_id`; False if it was already seen."""
        low = self.watermark.get(task_id, 0)
        others = self.others.get(task_id, set())
        if 0 <= idx < low or idx in others:
            return False
        if idx != low:
            self.others.setdefault(task_id, others).add(idx)
            return True
        low += 1
        while low in others:
            others.remove(low)
            low += 1
        self.watermark[task_id] = low
        return True


@dataclass(frozen=True)
class Timeouts:
    """The run timeouts of one scoring call: `limits` holds the problems whose timeout was
    calibrated above the configured one; `report` is the cell's `timeouts` record."""

    limits: Mapping[str, float]
    report: Mapping[str, Any]

    def apply(self, job: Job) -> Job:
        limit = self.limits.get(job.task_id)
        return job if limit is None or job.timeout is not None else replace(job, timeout=limit)


def calibrate_timeouts(
    checker: Checker,
    problems: Mapping[str, Mapping[str, Any]],
    timeout: float | None,
    factor: float,
    references: Sequence[Job],
    verdicts: Sequence[Verdict],
) -> Timeouts:
    """Per-problem timeouts: `max(configured, factor x the slowest run of the problem's reference
    solution)`, from the references' verdicts (`Verdict.run_s`). Problems without a measured
    reference keep the configured timeout (`Checker.run_timeout`), and so do problems that set
    their own time limit (`Checker.own_time_limit`: too slow for it is a wrong answer)."""
    return timeouts_from(checker, problems, timeout, factor, reference_run_s(references, verdicts))


def reference_run_s(references: Sequence[Job], verdicts: Sequence[Verdict]) -> dict[str, float]:
    """The slowest run of each problem's reference solution (`Verdict.run_s`), by task_id: what
    a self-test measured, which a self-test job records for the evaluate jobs it gates."""
    measured: dict[str, float] = {}
    for job, verdict in zip(references, verdicts):
        if verdict.run_s is not None:
            measured[job.task_id] = max(verdict.run_s, measured.get(job.task_id, 0.0))
    return measured


def timeouts_from(
    checker: Checker,
    problems: Mapping[str, Mapping[str, Any]],
    timeout: float | None,
    factor: float,
    measured: Mapping[str, float],
) -> Timeouts:
    """`calibrate_timeouts` from the references' run times already measured (`reference_run_s`)."""
    limits: dict[str, float] = {}
    effective: list[float] = []
    for task_id, problem in problems.items():
        configured = checker.run_timeout(problem, timeout)
        calibrated = 0.0 if checker.own_time_limit(problem) else factor * measured.get(task_id, 0.0)
        if calibrated > configured:
            limits[task_id] = calibrated
        effective.append(max(configured, calibrated))
    report = {
        "configured": float(timeout or checker.default_timeout),
        "factor": float(factor),
        "calibrated_problems": len(limits),
        "max_s": round(max(effective), 3),
        "median_s": round(statistics.median(effective), 3),
    }
    return Timeouts(limits, report)


def run_self_test(
    checker: Checker,
    problems: Mapping[str, Mapping[str, Any]],
    *,
    workers: int,
    timeout: float | None,
    timeout_factor: float = DEFAULT_TIMEOUT_FACTOR,
) -> tuple[dict[str, Any], Timeouts, dict[str, float]]:
    """Reference solutions must pass and known-wrong samples must fail, or `SelfTestError`;
    returns the report, the timeouts calibrated from the references' run times and those run
    times (`reference_run_s`: what a self-test job records for the evaluate jobs it gates).

    References run with `max(1, timeout_factor)` times the configured timeout, so that a
    reference slower than the configured timeout on a busy machine is measured, not failed;
    known-wrong samples run with the configured one.
    """
    headroom = max(1.0, timeout_factor)
    references = [
        job
        if job.timeout is not None
        else replace(job, timeout=headroom * checker.run_timeout(job.problem, timeout))
        for job in checker.reference_jobs(problems)
    ]
    wrong = checker.known_wrong_jobs(problems)
    verdicts = checker.check([*references, *wrong], workers=workers, timeout=timeout)
    report = self_test_report(checker, references, wrong, verdicts)
    off = getattr(checker, "self_test_off", None)
    if off:
        report["off"] = off
    measured = reference_run_s(references, verdicts[: len(references)])
    return report, timeouts_from(checker, problems, timeout, timeout_factor, measured), measured


def self_test_verdict(
    checker: Checker,
    problems: Mapping[str, Mapping[str, Any]],
    *,
    workers: int,
    timeout: float | None,
    timeout_factor: float = DEFAULT_TIMEOUT_FACTOR,
) -> dict[str, Any]:
    """What a passed self-test job records (ckpteval.selftest) and `score_samples` takes as
    `passed_self_test`: `{"self_test": report, "run_s": {task_id: reference run seconds}}`.
    The problems are validated first; `SelfTestError` if it fails."""
    for task_id, problem in problems.items():
        checker.validate_problem(task_id, problem)
    report, _, run_s = run_self_test(
        checker, problems, workers=workers, timeout=timeout, timeout_factor=timeout_factor
    )
    return {"self_test": report, "run_s": run_s}


def self_test_report(
    checker: Checker, references: Sequence[Job], wrong: Sequence[Job], verdicts: Sequence[Verdict]
) -> dict[str, Any]:
    """Judge the self-test's verdicts (references first, then known-wrong); raise if it failed,
    in one line naming what failed (the checker, a reward function and its setting), the rows
    and what to do (`Checker.self_test_words`)."""
    failed = [
        (job, v)
        for job, v in zip(references, verdicts[: len(references)])
        if not checker.self_test_accepts(v)
    ]
    passed = [(job, v) for job, v in zip(wrong, verdicts[len(references) :]) if v.passed]
    if failed or passed:
        subject, label, advice = checker.self_test_words()
        parts = []
        if failed:
            shown = "; ".join(
                f"{job.task_id}: {v.error_type or 'score ' + repr(v.score)}: "
                f"{' '.join(v.stderr_tail.split())[-300:]}".rstrip(": ")  # one line
                for job, v in failed[:3]
            )
            parts.append(
                f"{label} of {len(failed)} of {len(references)} problems did "
                f"not pass ({shown}); {advice}"
            )
        if passed:
            rows = ", ".join(job.task_id for job, _ in passed[:3])
            parts.append(
                f"{len(passed)} known-wrong samples passed (rows {rows}): the checker cannot "
                "tell right from wrong"
            )
        raise SelfTestError(f"{subject} self-test failed: " + " | ".join(parts))
    return {"references_passed": len(references), "known_wrong_failed": len(wrong)}
