"""What a checker must do (`Checker`): declare what the rest of the project asks of it (languages,
problem normaliser and validation, default prompt, the settings it reads, its task options, its
self-test) and judge jobs, one at a time (`check_one`) or in batches (`check_batch`)."""

from __future__ import annotations

import abc
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ckpteval.checkers import streaming
from ckpteval.checkers.records import Job, OnVerdicts, Prompting, Verdict
from ckpteval.errors import UserError


class Checker(abc.ABC):
    """Scores completions of one kind of problem. Subclasses set `name` and `version`.

    `check` must return one verdict per job, in order; infrastructure failures raise instead.
    The default `check` and `check_stream` run `check_batch` on a thread pool, and the default
    `check_batch` runs `check_one` on each job: a checker checks one job at a time (stdio, math)
    or sets `batch_size_for` to share costs within a batch (python). Checkers that need a whole
    call's jobs at once (rust compiles them together) override `check`, which makes them
    `streams = False`.
    """

    name: str = ""
    version: str = "1"
    default_timeout: float = 10.0
    #: Whether verdicts carry a meaningful `compile_ok` (code checkers report a compile rate).
    compiles: bool = False
    #: Whether `check_stream` may start jobs as they come (else it calls `check` on chunks).
    #: A subclass that overrides `check` does not stream unless it says so.
    streams: bool = True
    #: Whether `check_batch` takes `claims` (a `ckpteval.sandbox.Claims` for its jobs): a worker
    #: left idle then takes the jobs a running batch has not started (`streaming.stream`), and
    #: `check_batch` returns the verdicts of those it kept, a prefix of its jobs.
    takes_claims: bool = False
    #: Jobs an evaluate window holds per worker at least, so that each worker gets a full batch
    #: (0: the window as given; a window is bounded by its characters either way).
    window_per_worker: int = 0

    #: The languages a task of this checker may ask in (`tasks.<name>.language`); () for none.
    languages: tuple[str, ...] = ()
    #: Whether a task from a problem file (`tasks.<name>.problems`) may name this checker.
    for_problem_files: bool = True
    #: The `evaluate.*` config keys its verdicts depend on: a change of one rescores exactly the
    #: cells of the checkers that declare it (ckpteval.contract takes its rows' scope from here).
    reads: tuple[str, ...] = ("evaluate.timeout",)
    #: JSON schema (an object's `properties`) of the options a task's `checker:` mapping gives
    #: this checker (`checker: {<name>: value, option: value, ...}`); None: a name only.
    task_options: Mapping[str, Any] | None = None
    #: Keys that name this checker in a `checker:` mapping besides its name (another tool's
    #: spelling, which `canonical_options` translates).
    mapping_keys: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "check" in cls.__dict__ and "streams" not in cls.__dict__:
            cls.streams = False

    @classmethod
    def programs(cls, language: str | None, evaluate: Mapping[str, Any]) -> tuple[str, ...]:
        """The programs on PATH this checker runs to judge a task asked in `language` (None:
        told from each completion) under the config's `evaluate` section, besides Python and
        the sandbox. Where one is missing, a task marked `optional` is left out of the plan
        with one line (ckpteval.config), and any other task fails in its evaluate job, saying
        which."""
        return ()

    @classmethod
    def normalise_problem(cls, row: Mapping[str, Any]) -> dict[str, Any]:
        """One line of a problem file as the record this checker reads (raise KeyError,
        TypeError or ValueError with what is wrong: the caller names file and line)."""
        return dict(row)

    @classmethod
    def check_problem(cls, task_id: str, problem: Mapping[str, Any]) -> None:
        """Raise `UserError` if `problem` lacks what this checker needs, without building the
        checker (nothing is started): what is checked at parse time."""

    @classmethod
    def default_prompt(
        cls, problems: Sequence[Mapping[str, Any]], language: str | None, task: str
    ) -> Prompting:
        """How a problem-file task of this checker is prompted when it sets no `prompt`.
        `problems` are the task's records (the first one tells their shape). By default: the
        problem's `prompt` field as it is, no stop strings (chat models end their turn)."""
        return Prompting(lambda problem: problem["prompt"])

    @classmethod
    def check_task_options(cls, key: str, options: Mapping[str, Any]) -> None:
        """Raise a one-line `UserError` naming `key` (the task's `checker` key) unless a task's
        `checker:` mapping fits `task_options`, and every file option (`x-content`) exists."""
        if cls.task_options is None:
            raise UserError(f"{key}: checker {cls.name} takes no options; give its name")
        import jsonschema

        schema = {"type": "object", "additionalProperties": False, **cls.task_options}
        validator = jsonschema.Draft7Validator(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(dict(options)))
        if error is not None:
            where = "".join(f".{p}" for p in error.absolute_path)
            raise UserError(f"{key}{where}: {error.message}")
        for option, prop in cls.task_options.get("properties", {}).items():
            if prop.get("x-content") and option in options:
                path = os.path.expanduser(os.path.expandvars(str(options[option])))
                if not os.path.isfile(path):
                    raise UserError(f"{key}.{option}: no file {os.path.abspath(path)}")

    @classmethod
    def canonical_options(cls, key: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """A task's `checker:` mapping as identities hold it: checked (`check_task_options`),
        and without the options set to their documented `default` (the schema's), so writing
        out a default is the same setting as leaving it unset and reruns nothing. A checker
        that takes another tool's spelling of its options translates it here (first)."""
        cls.check_task_options(key, options)
        props = (cls.task_options or {}).get("properties") or {}
        return {
            option: value
            for option, value in options.items()
            if not ("default" in props.get(option, {}) and _same(value, props[option]["default"]))
        }

    @classmethod
    def content_id(cls, option: str, path: os.PathLike[str] | str) -> str:
        """The sha256 a file option (`x-content`) counts by in the scoring identity: the file's
        content by default. A checker whose file reads others (a reward function's own modules)
        counts them too, so editing one rescores and moving them all reruns nothing."""
        from ckpteval.io import sha256_file

        return sha256_file(path)

    @classmethod
    def check_run_config(cls, tasks: Mapping[str, Any], evaluate: Mapping[str, Any]) -> None:
        """Raise `UserError` at parse time if the config's `evaluate` section cannot judge the
        problems of this checker's tasks (name -> `ckpteval.tasks.TaskSpec`, whose `problems()`
        reads them) as they ask."""

    def validate_problem(self, task_id: str, problem: Mapping[str, Any]) -> None:
        """Raise `UserError` if `problem` lacks what this checker needs (the evaluate job asks
        the built checker, which may know more: a server's limits)."""
        self.check_problem(task_id, problem)

    def run_timeout(self, problem: Mapping[str, Any], timeout: float | None) -> float:
        """Seconds a run of a sample of `problem` gets when its job sets no `timeout`, given the
        call's `timeout` (None: the checker's default)."""
        return timeout or self.default_timeout

    def own_time_limit(self, problem: Mapping[str, Any]) -> bool:
        """Whether `problem` sets its own time limit. Such a limit is part of what the problem asks
        (a solution too slow for it is wrong, as on a judge), so it is never calibrated and a job's
        `timeout` does not replace it."""
        return False

    def check(
        self,
        jobs: Sequence[Job],
        *,
        workers: int,
        timeout: float | None = None,
        on_verdicts: OnVerdicts | None = None,
    ) -> list[Verdict]:
        """One verdict per job, in order, each job run under its own `timeout` if it has one,
        else the call's. `on_verdicts` hears of verdicts as they are reached, as (job index,
        verdict) pairs, from any thread (callers persist progress with it)."""
        # One more than the jobs: the stream then reads past the last one and knows that the
        # input ended before it starts the last batches, which it shares among the workers.
        # With a window of exactly the jobs, it started one more full batch first and split
        # only what was left (the Python self-test's 166 references: 42, 42, 42, 20, 20 on two
        # workers, five sandboxes, where 42, 42, 41, 41 take four).
        size = len(jobs) + 1
        return list(
            streaming.stream(
                self,
                jobs,
                workers=workers,
                timeout=timeout,
                on_verdicts=on_verdicts,
                window=size,
                window_chars=sys.maxsize,
                buffer=size,
            )
        )

    def check_stream(
        self,
        items: Iterable[Job | Verdict],
        *,
        workers: int,
        timeout: float | None = None,
        on_verdicts: OnVerdicts | None = None,
        window: int,
        window_chars: int,
        buffer: int,
    ) -> Iterator[Verdict]:
        """One verdict per item, in order, as `check` would give them: a `Verdict` item is
        passed through (decided without running), a `Job` is checked. `items` is read lazily.

        What it holds at once is bounded: at most `window` jobs read and not yet checked, with
        up to `window_chars` characters of completions (but always one job), and at most
        `buffer` items read and not yet yielded (verdicts reached after that of a slow job wait
        for it). A streaming checker keeps its workers busy across the whole input: a slow job
        holds up the output, not the other workers, until the buffer is full. A checker that
        does not stream (`streams = False`) gets `check` calls on consecutive chunks of `window`
        items (or `window_chars` characters), each call ending before the next starts.

        `on_verdicts` hears of verdicts as they are reached, as (item index, verdict) pairs,
        passed-through items excepted; after a job raised, of none.
        """
        if self.streams:
            return streaming.stream(
                self,
                items,
                workers=workers,
                timeout=timeout,
                on_verdicts=on_verdicts,
                window=window,
                window_chars=window_chars,
                buffer=buffer,
            )
        return streaming.chunked(
            self,
            items,
            workers=workers,
            timeout=timeout,
            on_verdicts=on_verdicts,
            window=window,
            window_chars=window_chars,
        )

    def batch_size_for(self, n_jobs: int, workers: int) -> int:
        """Jobs per `check_batch` call, given how many jobs are at hand (a call's, or a stream's
        window) and the workers: 1, unless a batch shares a cost (a sandbox) among its jobs."""
        return 1

    def check_batch(self, jobs: Sequence[Job], timeout: float) -> list[Verdict]:
        """Verdicts of consecutive jobs, on one worker; each job runs under its own `timeout` if
        it has one, else `timeout`."""
        return [self.check_one(job, job.timeout or timeout) for job in jobs]

    def check_one(self, job: Job, timeout: float) -> Verdict:
        raise NotImplementedError(f"{type(self).__name__} checks in batches; call check()")

    def self_test_words(self) -> tuple[str, str, str]:
        """How a failed self-test's one line names (what failed, what its references are, what
        to do): a checker of a user's own code names the code and the setting that chose the
        test (ckpteval.checkers.reward)."""
        return (
            f"checker {self.name}",
            "reference solutions",
            "fix or drop those problems, or check the sandbox",
        )

    def self_test_accepts(self, verdict: Verdict) -> bool:
        """Whether a reference's verdict passes the self-test: it passed, by default."""
        return verdict.passed

    @abc.abstractmethod
    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        """Jobs whose completions are the problems' reference solutions (must pass)."""

    @abc.abstractmethod
    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        """Jobs built to fail (must fail): at least one, whatever the problems are."""

    def cell_fields(self) -> dict[str, Any]:
        """What the cell's file records of this checker's setup beyond its name and version (the
        package environment its samples ran with, ...): none by default."""
        return {}

    def close(self) -> None:
        """Release helper processes; the checker is not used afterwards."""


def _same(value: Any, default: Any) -> bool:
    """Whether a configured value is its default: equal, and a bool only to a bool (`1` is not
    `true`), a number to a number (`1` is `1.0`)."""
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return bool(value == default)
