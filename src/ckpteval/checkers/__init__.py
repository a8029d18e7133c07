"""The checker registry: what a verdict is, what a checker must do, and how to get one by name.

A checker turns (problem, completion) pairs into `Verdict`s. Every language shares one error
taxonomy (`ERROR_TYPES`) so cells are comparable across checkers. A checker also knows how to test
itself: `reference_jobs` (solutions shipped with the problems, which must pass) and
`known_wrong_jobs` (samples built to fail, which must fail); `ckpteval.evaluate` runs both before
scoring and stops the run if either misbehaves.

A checker is one file: a `Checker` subclass that declares everything the rest of the project
asks of it (its languages, problem normaliser and validation, default prompt, the `evaluate.*`
settings it reads, the options a task's `checker:` mapping gives it, its self-test) and one
`register()` call at its end. `ckpteval.tasks`, `ckpteval.problems`, `ckpteval.contract` and
`ckpteval.config` ask this registry (`checker_class`) and never import a checker's private names.
The built-in checkers are imported on first use; files or directories named in the
`CKPTEVAL_CHECKERS` environment variable (`os.pathsep`-separated) are imported after them, so a
checker of your own needs no change to ckpteval.
"""

from __future__ import annotations

import abc
import contextlib
import inspect
import itertools
import os
import queue
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ckpteval.errors import UserError

#: Environment variable naming checker files (or directories of them) to load besides the
#: built-in ones.
PLUGIN_ENV = "CKPTEVAL_CHECKERS"

#: One taxonomy across languages. `None` means the sample passed.
ERROR_TYPES = (
    "compile_error",  # the program does not compile / parse
    "runtime_error",  # it crashed (exception, panic, signal, early exit)
    "timeout",  # wall-clock or CPU limit
    "memory_limit",  # memory limit hit (MemoryError, failed allocation, the cgroup's kill)
    "output_limit",  # wrote more than the output cap
    "wrong_answer",  # ran to completion, but a test assertion or expected output failed
    "no_tests",  # the program ran but the problem's tests did not (e.g. compiled out)
    "no_answer",  # math: no final answer could be extracted
    "sandbox_error",  # the sandbox refused this one program (e.g. its tmpfs filled up)
    "too_large",  # the completion exceeds the size the checker accepts
    "truncated_reasoning",  # its reasoning never ended (ckpteval.reasoning): no answer to score
    "reward_error",  # a reward function raised, or returned something that is not a score
)

#: Reward hacks a sample can attempt, one taxonomy across languages. A verdict records one
#: (`Verdict.hack`, None when none was seen; the most specific when several were, in this order);
#: a pass is only ever earned by the tests, so a hack never makes a sample pass. Every scored line
#: carries `"hack"`, and each cell reports the share of samples that tried one (`hack_rate`, with
#: counts per type in `hack_types`), so a team sees when an RL run starts learning to game the
#: checker. Checkers that detect nothing (math, stdio, lm-eval metrics) report `hack_rate` 0.
#: How python detects each: `ckpteval.checkers.python` (what the run saw, else the code's AST).
HACK_TYPES = (
    "exit_before_tests",  # ended its process (exit, abort, os._exit) before the tests ran
    "fake_test_report",  # printed a test-runner report or a success marker itself
    "redefines_assertions",  # redefined assert / assert_eq! / the test framework
    "tampers_with_tests",  # changed the tests, the harness's state or another sample's code
    "reads_harness_files",  # read the harness's own files, secrets or other samples' sources
    "always_equal_object",  # returned an object that compares equal to anything
    "binary_wide_code",  # code acting on the whole program (global_asm!, #[global_allocator], unsafe, FFI)
)

#: Completions longer than this are not run: a verdict of `too_large`, and an input error.
MAX_COMPLETION_CHARS = 1_000_000

STDERR_TAIL_CHARS = 2000


@dataclass
class Verdict:
    """The outcome of one sample. `extras` are checker-specific fields added to its JSONL line.

    `duration_s` is everything the sample cost (its share of a batch compile included); `run_s`
    is how long its program ran under the run timeout (the slowest run, for checkers that run it
    once per test), or None when nothing ran. `hack` is the reward hack the sample attempted
    (one of `HACK_TYPES`), or None. A reference solution's `run_s` is what
    `ckpteval.evaluate` calibrates that problem's timeout from; it is not written to the JSONL.
    """

    passed: bool
    error_type: str | None = None
    compile_ok: bool | None = None
    duration_s: float = 0.0
    stderr_tail: str = ""
    score: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    run_s: float | None = None
    hack: str | None = None

    def __post_init__(self) -> None:
        if self.error_type is not None and self.error_type not in ERROR_TYPES:
            raise ValueError(f"unknown error type {self.error_type!r}")
        if self.hack is not None and self.hack not in HACK_TYPES:
            raise ValueError(f"unknown hack type {self.hack!r}")
        if self.passed != (self.error_type is None):
            raise ValueError(f"passed={self.passed} contradicts error_type={self.error_type!r}")
        if self.score is None:
            self.score = 1.0 if self.passed else 0.0

    def record(self) -> dict[str, Any]:
        """The per-sample JSONL fields (without task_id / sample_idx)."""
        return {
            "passed": self.passed,
            "score": self.score,
            "error_type": self.error_type,
            "compile_ok": self.compile_ok,
            "duration_s": round(self.duration_s, 4),
            "stderr_tail": self.stderr_tail,
            "hack": self.hack,
            **self.extras,
        }


@dataclass(frozen=True)
class Prompting:
    """How a task's problems are prompted by default: `render(problem)` is the prompt, and the
    engine stops at `stop` (kept in the completion when `include_stop`)."""

    render: Callable[[dict[str, Any]], Any]
    stop: tuple[str, ...] = ()
    include_stop: bool = False


@dataclass(frozen=True)
class Job:
    """One sample to check: its problem record and its raw completion. `timeout`, when set,
    replaces the run timeout the checker would otherwise use for this job (`Checker.run_timeout`):
    it is how `ckpteval.evaluate` gives each problem its calibrated timeout."""

    task_id: str
    problem: Mapping[str, Any]
    completion: str
    timeout: float | None = None


#: Receives (job index, verdict) pairs as a checker reaches them.
OnVerdicts = Callable[[list[tuple[int, "Verdict"]]], None]


def tail(data: bytes | str, limit: int = STDERR_TAIL_CHARS) -> str:
    """The last `limit` characters of a program's output, decoded leniently."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text[-limit:]


def timeout_line(configured: float, limit: float, wall: float) -> str:
    """The line a timeout verdict ends with. It names the number the user set first (the
    configured timeout, `evaluate.timeout`, the checker's default when unset), then this
    problem's limit when calibration raised it (`ckpteval.evaluate.calibrate_timeouts`), then
    the wall clock the sandbox stopped the run at when that is longer (bwrap stops a program
    that blocks only at `WALL_FACTOR` x its CPU budget): a run killed at 20 s wall under a
    10 s timeout reads as both, never as a limit of 20 s."""
    words = f"evaluate.timeout {_seconds(configured)} s"
    if limit != configured:
        words += f", {_seconds(limit)} s for this problem"
    if wall != limit:
        words += f"; wall limit {_seconds(wall)} s"
    return f"timed out ({words})"


def _seconds(value: float) -> str:
    """Seconds as the cell's `timeouts` record rounds them (ms), without trailing zeros."""
    return f"{round(value, 3):g}"


def with_timeout_line(stderr_tail: str, line: str) -> str:
    """A timeout verdict's `stderr_tail`: what the program printed, then `line` last (the part
    one-line summaries keep, e.g. a failed self-test's)."""
    return f"{stderr_tail.rstrip()}\n{line}" if stderr_tail.strip() else line


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
        size = max(1, len(jobs))
        return list(
            self._stream(
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
            return self._stream(
                items,
                workers=workers,
                timeout=timeout,
                on_verdicts=on_verdicts,
                window=window,
                window_chars=window_chars,
                buffer=buffer,
            )
        return self._chunked(
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

    def _stream(
        self,
        items: Iterable[Job | Verdict],
        *,
        workers: int,
        timeout: float | None,
        on_verdicts: OnVerdicts | None,
        window: int,
        window_chars: int,
        buffer: int,
    ) -> Iterator[Verdict]:
        """`check_stream` on a thread pool: a batch starts once it is full, or once the input
        ends or a worker would idle; finished batches are collected in the order they started,
        so that a failure stops the stream at the first failed batch.

        A batch of several jobs (`batch_size_for` above 1) starts only on a free worker, and its
        size is chosen then, from what has been read: a full batch once there is one for every
        free worker; what is held, shared among the free workers, when no more can be read
        yet; and what was left when the input ended, shared among all the workers (a full batch
        started last would end long after the others; a cell smaller than a batch per worker
        is spread over all of them)."""
        timeout = timeout or self.default_timeout
        workers = max(1, workers)
        size = max(1, self.batch_size_for(window, workers))
        ahead = workers if size > 1 else window  # batches started at once (run or queued)
        tail = size  # a batch's size once the input has ended
        source = enumerate(items)
        slots: deque[_Slot] = deque()  # items read and not yet yielded, in order
        batch: list[tuple[int, _Slot, Job]] = []  # jobs read and not yet started
        running: dict[Future[list[Verdict]], tuple[int, list[tuple[int, _Slot, Job]]]] = {}
        finished: queue.SimpleQueue[Future[list[Verdict]]] = queue.SimpleQueue()
        order = itertools.count()  # of the batches' starts
        held = held_chars = 0  # jobs read and not yet checked, and their characters
        exhausted = False
        with ThreadPoolExecutor(max_workers=workers) as pool, cancel_on_error(running):

            def start(n: int) -> None:
                nonlocal batch
                taken, batch = batch[:n], batch[n:]
                future = pool.submit(self.check_batch, [job for *_, job in taken], timeout)
                running[future] = (next(order), taken)
                future.add_done_callback(finished.put)

            while True:
                while (
                    not exhausted
                    and len(slots) < buffer
                    and held < window
                    and (held == 0 or held_chars < window_chars)
                ):
                    index, item = next(source, (-1, None))
                    if item is None:
                        exhausted = True
                        tail = max(1, min(size, -(-len(batch) // workers)))
                    elif isinstance(item, Verdict):
                        slots.append(_Slot(item))
                    else:
                        slots.append(slot := _Slot())
                        batch.append((index, slot, item))
                        held, held_chars = held + 1, held_chars + len(item.completion)
                        while _full(len(batch), size, ahead - len(running)):
                            start(size)
                while batch and len(running) < ahead:
                    free = ahead - len(running)
                    start(tail if exhausted else min(size, -(-len(batch) // free)))
                while slots and slots[0].verdict is not None:
                    yield slots.popleft().verdict  # type: ignore[misc]
                if not slots:
                    if exhausted:
                        return
                    continue
                done = [finished.get()]
                while not finished.empty():
                    done.append(finished.get_nowait())
                for future in sorted(done, key=lambda f: running[f][0]):
                    verdicts = future.result()
                    _, entries = running.pop(future)
                    for (_, slot, job), verdict in zip(entries, verdicts, strict=True):
                        slot.verdict = verdict
                        held, held_chars = held - 1, held_chars - len(job.completion)
                    if on_verdicts:
                        on_verdicts(
                            [(index, verdict) for (index, *_), verdict in zip(entries, verdicts)]
                        )

    def _chunked(
        self,
        items: Iterable[Job | Verdict],
        *,
        workers: int,
        timeout: float | None,
        on_verdicts: OnVerdicts | None,
        window: int,
        window_chars: int,
    ) -> Iterator[Verdict]:
        """`check_stream` for a checker that does not stream: `check` on consecutive chunks."""
        chunk: list[Job | Verdict] = []
        first = chars = 0
        for item in items:
            chunk.append(item)
            chars += len(item.completion) if isinstance(item, Job) else 0
            if len(chunk) >= window or chars >= window_chars:
                yield from self._check_chunk(
                    chunk, first, workers=workers, timeout=timeout, on_verdicts=on_verdicts
                )
                first, chunk, chars = first + len(chunk), [], 0
        yield from self._check_chunk(
            chunk, first, workers=workers, timeout=timeout, on_verdicts=on_verdicts
        )

    def _check_chunk(
        self,
        chunk: list[Job | Verdict],
        first: int,
        *,
        workers: int,
        timeout: float | None,
        on_verdicts: OnVerdicts | None,
    ) -> Iterator[Verdict]:
        """The verdicts of the items `first`, `first + 1`, ... of a stream, by one `check` call."""
        todo = [i for i, item in enumerate(chunk) if isinstance(item, Job)]
        if not todo:
            yield from chunk  # type: ignore[misc]
            return

        def listener(done: list[tuple[int, Verdict]]) -> None:
            on_verdicts([(first + todo[i], verdict) for i, verdict in done])  # type: ignore[misc]

        checked = iter(
            self.check(
                [chunk[i] for i in todo],
                workers=workers,  # type: ignore[misc]
                timeout=timeout,
                on_verdicts=listener if on_verdicts else None,
            )
        )
        for item in chunk:
            yield next(checked) if isinstance(item, Job) else item

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

    def close(self) -> None:
        """Release helper processes; the checker is not used afterwards."""


def _full(held: int, size: int, free: int) -> bool:
    """Whether `held` jobs not yet started make a full batch of `size` for each of the `free`
    workers (for a batch of one job: for one of them)."""
    return free > 0 and held >= size * (free if size > 1 else 1)


@dataclass
class _Slot:
    """An item of a stream between being read and being yielded: its verdict once known."""

    verdict: Verdict | None = None


@contextlib.contextmanager
def cancel_on_error(futures: Iterable[Future[Any]]) -> Iterator[None]:
    """When a result raises (an infrastructure failure), cancel the work not yet started instead
    of running every remaining sample into the same failure."""
    try:
        yield
    except BaseException:
        for future in futures:
            future.cancel()
        raise


CheckerFactory = Callable[..., Checker]
_REGISTRY: dict[str, CheckerFactory] = {}


def register(name: str, factory: CheckerFactory) -> None:
    """Make `factory(**options)` available as checker `name`."""
    if name in _REGISTRY:
        raise ValueError(f"checker {name!r} registered twice")
    _REGISTRY[name] = factory


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def checker_class(name: str) -> type[Checker]:
    """The class of checker `name` (what it declares: languages, prompt, settings it reads),
    or a `UserError` naming the known ones."""
    _load_builtins()
    factory = _REGISTRY.get(name)
    if not isinstance(factory, type) or not issubclass(factory, Checker):
        raise UserError(f"unknown checker {name!r}; known checkers: {', '.join(sorted(_REGISTRY))}")
    return factory


def checker_named_by(key: str) -> str | None:
    """The checker a key of a task's `checker:` mapping names: its name, or another spelling
    it declares (`Checker.mapping_keys`: verl's `custom_reward_function`); None for an option."""
    _load_builtins()
    if key in _REGISTRY:
        return key
    for name, factory in _REGISTRY.items():
        if key in getattr(factory, "mapping_keys", ()):
            return name
    return None


def problem_file_checkers() -> list[str]:
    """The checkers a task from a problem file may name."""
    _load_builtins()
    return sorted(n for n in _REGISTRY if getattr(_REGISTRY[n], "for_problem_files", False))


def readers_of(key: str) -> tuple[str, ...]:
    """The checkers whose verdicts depend on the `evaluate.*` config key `key`."""
    _load_builtins()
    return tuple(sorted(n for n, f in _REGISTRY.items() if key in getattr(f, "reads", ())))


def get_checker(name: str, /, **options: Any) -> Checker:
    """Build checker `name`. Options a checker does not take (e.g. a Piston `endpoint` for the
    python checker) are ignored, so one options dict serves every task of a run; an option no
    checker knows is a `UserError`. `name` is positional-only: a checker's own option may be
    called `name` too (a reward function's, as verl names it)."""
    _load_builtins()
    if name not in _REGISTRY:
        raise UserError(f"unknown checker {name!r}; known checkers: {', '.join(sorted(_REGISTRY))}")
    known = set().union(*(_parameters(f) for f in _REGISTRY.values()))
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(
            f"checker {name}: unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    factory = _REGISTRY[name]
    missing = sorted(_required(factory) - set(options))
    if missing:
        raise UserError(f"checker {name}: needs option(s) {', '.join(missing)}")
    return factory(**{k: v for k, v in options.items() if k in _parameters(factory)})


def checker_version(name: str) -> str:
    """Checker `name`'s version (part of every cell's scoring identity: a new version rescores);
    "harness" for lm-eval's own metrics."""
    _load_builtins()
    factory = _REGISTRY.get(name)
    return str(getattr(factory, "version", "1")) if factory is not None else "harness"


def _same(value: Any, default: Any) -> bool:
    """Whether a configured value is its default: equal, and a bool only to a bool (`1` is not
    `true`), a number to a number (`1` is `1.0`)."""
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return bool(value == default)


def _parameters(factory: CheckerFactory) -> set[str]:
    return {
        p.name
        for p in inspect.signature(factory).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }


def _required(factory: CheckerFactory) -> set[str]:
    return {
        p.name
        for p in inspect.signature(factory).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    }


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


_loaded = False


def _load_builtins() -> None:
    """Import the built-in checker modules once, then the files `CKPTEVAL_CHECKERS` names;
    each registers itself."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from ckpteval.checkers import math, python, reward, rust, stdio  # noqa: F401

    for entry in filter(None, os.environ.get(PLUGIN_ENV, "").split(os.pathsep)):
        _load_plugin(entry)


def _load_plugin(entry: str) -> None:
    """Import a checker file (or every `*.py` of a directory) named in `CKPTEVAL_CHECKERS`."""
    import importlib.util
    from pathlib import Path

    path = Path(entry).expanduser()
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    for file in files:
        if not file.is_file():
            raise UserError(f"{PLUGIN_ENV}: no checker file {file}")
        name = f"ckpteval_checker_{file.stem}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
