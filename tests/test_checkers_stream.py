"""Checker.check_stream: verdicts in input order, passed-through verdicts, progress, and what it
holds at once (jobs in its window, items behind a slow job), for checkers that stream and for
those that are fed chunks."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from ckpteval.checkers import Checker, Job, Verdict
from ckpteval.checkers.python import PythonChecker
from ckpteval.sandbox import Claims, SandboxError


class _Echo(Checker):
    """Passes completions starting with `ok` after a random pause; records how many jobs are
    between being read (`reads`) and being checked, and what `check_stream` started."""

    name = "echo"

    def __init__(self, batch: int = 1) -> None:
        self.batch = batch
        self.lock = threading.Lock()
        self.reads = self.checked = self.most_held = 0
        self.batches: list[int] = []
        self.firsts: list[tuple[str, int]] = []  # (its first job's completion, its size)

    def items(self, source: Sequence[Job | Verdict]) -> Iterator[Job | Verdict]:
        for item in source:
            if isinstance(item, Job):
                with self.lock:
                    self.reads += 1
                    self.most_held = max(self.most_held, self.reads - self.checked)
            yield item

    def batch_size_for(self, n_jobs: int, workers: int) -> int:
        return self.batch

    def check_batch(self, jobs: Sequence[Job], timeout: float) -> list[Verdict]:
        self.batches.append(len(jobs))
        self.firsts.append((jobs[0].completion, len(jobs)))
        return super().check_batch(jobs, timeout)

    def check_one(self, job: Job, timeout: float) -> Verdict:
        time.sleep(random.Random(job.completion).random() / 500)
        with self.lock:
            self.checked += 1
        ok = job.completion.startswith("ok")
        return Verdict(ok, None if ok else "wrong_answer", stderr_tail=job.completion)

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return []

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        return []


class _Chunked(_Echo):
    """The same verdicts, but only through whole `check` calls (as rust)."""

    streams = False

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def check(
        self,
        jobs: Sequence[Job],
        *,
        workers: int,
        timeout: float | None = None,
        on_verdicts: Any = None,
    ) -> list[Verdict]:
        self.calls.append(len(jobs))
        return super().check(jobs, workers=workers, timeout=timeout, on_verdicts=on_verdicts)


def _items(n: int, seed: int) -> list[Job | Verdict]:
    """Jobs and, between them, verdicts decided without running (every fifth item)."""
    rng = random.Random(seed)
    return [
        Verdict(False, "too_large", stderr_tail=f"preset {i}")
        if i % 5 == 3
        else Job("t", {}, f"{rng.choice(['ok', 'no'])} {i}" + "x" * rng.randrange(20))
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "make", [_Echo, lambda: _Echo(batch=3), _Chunked], ids=["one-by-one", "batches", "chunked"]
)
@pytest.mark.parametrize("window", [1, 4, 50])
def test_verdicts_come_in_order_within_the_window(make: Callable[[], _Echo], window: int) -> None:
    checker = make()
    items = _items(200, seed=window)
    heard: list[int] = []
    verdicts = list(
        checker.check_stream(
            checker.items(items),
            workers=3,
            window=window,
            window_chars=10**9,
            buffer=4 * window,
            on_verdicts=lambda done: heard.extend(i for i, _ in done),
        )
    )
    assert [v.stderr_tail for v in verdicts] == [
        item.stderr_tail if isinstance(item, Verdict) else item.completion for item in items
    ]
    assert [v.passed for v in verdicts] == [
        isinstance(item, Job) and item.completion.startswith("ok") for item in items
    ]
    assert sorted(heard) == [i for i, item in enumerate(items) if isinstance(item, Job)]
    assert checker.most_held <= window
    if isinstance(checker, _Chunked):
        assert checker.calls and max(checker.calls) <= window
        assert sum(checker.calls) == sum(isinstance(item, Job) for item in items)
    else:
        # full batches, unless a window cannot hold one for each of the 3 workers: then what
        # it holds is shared among them
        assert max(checker.batches) == min(checker.batch, -(-window // 3))
        assert sum(checker.batches) == checker.reads


def test_characters_of_completions_close_the_window() -> None:
    checker = _Echo()
    items = [Job("t", {}, f"ok {i} " + "x" * 100) for i in range(40)]
    verdicts = list(
        checker.check_stream(
            checker.items(items), workers=4, window=30, window_chars=250, buffer=100
        )
    )
    assert all(v.passed for v in verdicts) and len(verdicts) == 40
    assert checker.most_held <= 3  # 3 x 106 characters reach 250; a fourth waits


@pytest.mark.parametrize("jobs", [300, 1100, 5000])
def test_a_streams_last_jobs_are_shared_among_the_workers(jobs: int) -> None:
    """Batches of 64 on 8 workers, a window of two batches per worker (as the reward checker
    asks): full batches while more input comes; what is left when the input ends is shared among
    the 8 workers, at most a batch each (a cell of 300: 8 batches of 38, not four of 64 and one
    of 44 on five workers, three idle)."""
    checker = _Echo(batch=64)
    items = [Job("t", {}, f"ok {i}") for i in range(jobs)]
    verdicts = list(
        checker.check_stream(
            checker.items(items), workers=8, window=2 * 8 * 64, window_chars=10**9, buffer=10**5
        )
    )
    assert len(verdicts) == jobs and all(v.passed for v in verdicts)
    # Batches take the jobs in input order: their first jobs give the order they started in.
    sizes = [n for _, n in sorted(checker.firsts, key=lambda f: int(f[0].split()[1]))]
    assert sum(sizes) == jobs and max(sizes) <= 64, sizes

    def shared(k: int) -> bool:  # the last k batches, started after the input ended, share it
        left = sum(sizes[-k:])
        each = min(64, -(-left // 8))
        return (
            k == -(-left // each)
            and sizes[:-k] == [64] * (len(sizes) - k)
            and sizes[-k:] == [each] * (k - 1) + [left - each * (k - 1)]
        )

    assert any(shared(k) for k in range(1, min(8, len(sizes)) + 1)), sizes
    if jobs == 300:
        assert sizes == [38] * 7 + [34]


class _TwoPerWorker(_Echo):
    """Batches as the Python checker sizes them (its own method): two per worker, up to
    `batch_size`."""

    batch_size = 64
    batch_size_for = PythonChecker.batch_size_for


def test_a_check_calls_last_jobs_are_shared_among_the_workers() -> None:
    """`check` (the self-test's call) knows where its jobs end before it starts the last
    batches: 166 jobs on two workers are four batches, the last two sharing what is left,
    not a third full one and two halves of the rest (a sandbox more)."""
    checker = _TwoPerWorker()
    items = [Job("t", {}, f"ok {i}") for i in range(166)]
    verdicts = checker.check(items, workers=2)
    assert [v.stderr_tail for v in verdicts] == [job.completion for job in items]
    assert sorted(checker.batches) == [41, 41, 42, 42], checker.batches


class _Spread(_Echo):
    """Records, per batch, how many of its jobs are one problem's (completions `ok slow ...`)."""

    def __init__(self, batch: int) -> None:
        super().__init__(batch)
        self.slow_per_batch: list[int] = []

    def check_batch(self, jobs: Sequence[Job], timeout: float) -> list[Verdict]:
        self.slow_per_batch.append(sum(job.completion.startswith("ok slow") for job in jobs))
        return super().check_batch(jobs, timeout)


def test_a_problems_consecutive_samples_go_to_several_batches() -> None:
    """8 consecutive samples of one problem (all endless, say) among 64, batches of 8 on two
    workers: the first two batches take every other job, 4 of the 8 each, where consecutive
    batches would give one worker all 8 timeouts to run one after another."""
    checker = _Spread(batch=8)
    items = [Job("t", {}, f"ok slow {i}") for i in range(8)]
    items += [Job("t", {}, f"ok {i}") for i in range(8, 64)]
    verdicts = checker.check(items, workers=2)
    assert [v.stderr_tail for v in verdicts] == [job.completion for job in items]
    assert checker.slow_per_batch[:2] == [4, 4] and sum(checker.slow_per_batch) == 8


class _HeadWaits(_Echo):
    """The first job waits until the stream has read `release_at` jobs (or a second: then it
    `waited_out`); the others are quick. `read_when_released` is how many jobs had been read when
    it stopped waiting."""

    def __init__(self, release_at: int) -> None:
        super().__init__()
        self.release_at = release_at
        self.released = threading.Event()
        self.waited_out = False
        self.read_when_released = 0

    def items(self, source: Sequence[Job | Verdict]) -> Iterator[Job | Verdict]:
        for item in super().items(source):
            if self.reads >= self.release_at:
                self.released.set()
            yield item

    def check_one(self, job: Job, timeout: float) -> Verdict:
        if job.completion == "ok head":
            self.waited_out = not self.released.wait(timeout=1)
            self.read_when_released = self.reads
        return super().check_one(job, timeout)


def test_a_slow_job_holds_up_the_output_not_the_other_workers() -> None:
    """The head job waits for the 30th read: the other worker checks the 29 after it meanwhile,
    window after window; a stream that waited for each window to finish would never get there."""
    checker = _HeadWaits(release_at=30)
    jobs = [Job("t", {}, "ok head"), *(Job("t", {}, f"ok {i}") for i in range(1, 40))]
    verdicts = list(
        checker.check_stream(
            checker.items(jobs), workers=2, window=4, window_chars=10**9, buffer=100
        )
    )
    assert all(v.passed for v in verdicts) and len(verdicts) == 40
    assert not checker.waited_out and checker.read_when_released >= 30
    assert checker.most_held <= 4


def test_the_buffer_behind_a_slow_job_is_bounded() -> None:
    """With room for 12 items behind nothing else, the head job is never released: the stream
    reads 12 and then waits for it."""
    checker = _HeadWaits(release_at=13)
    jobs = [Job("t", {}, "ok head"), *(Job("t", {}, f"ok {i}") for i in range(1, 40))]
    verdicts = list(
        checker.check_stream(
            checker.items(jobs), workers=2, window=4, window_chars=10**9, buffer=12
        )
    )
    assert len(verdicts) == 40 and checker.waited_out
    assert checker.read_when_released == 12


class _FailsAt(_Echo):
    def check_one(self, job: Job, timeout: float) -> Verdict:
        if job.completion == "die":
            raise RuntimeError("the sandbox went away")
        return super().check_one(job, timeout)


def test_a_failure_stops_the_stream_and_what_was_not_started() -> None:
    checker = _FailsAt()
    jobs = [Job("t", {}, "ok" if i != 5 else "die") for i in range(200)]
    heard: list[int] = []
    stream = checker.check_stream(
        checker.items(jobs),
        workers=1,
        window=3,
        window_chars=10**9,
        buffer=6,
        on_verdicts=lambda done: heard.extend(i for i, _ in done),
    )
    with pytest.raises(RuntimeError, match="went away"):
        list(stream)
    assert heard == [0, 1, 2, 3, 4]  # and not the verdicts of jobs after the failed one
    assert checker.reads <= 8  # up to the window: jobs 5, 6 and 7


def test_a_checker_overriding_check_does_not_stream_unless_it_says_so() -> None:
    from ckpteval.checkers import Checker

    class Whole(Checker):
        def check(self, jobs, **kwargs):  # type: ignore[no-untyped-def, override]
            return []

        def reference_jobs(self, problems):  # type: ignore[no-untyped-def]
            return []

        def known_wrong_jobs(self, problems):  # type: ignore[no-untyped-def]
            return []

    class Opted(Whole):
        streams = True

    assert Whole.streams is False and Opted.streams is True
    from ckpteval.checkers.python import PythonChecker
    from ckpteval.checkers.rust.checker import RustChecker

    assert PythonChecker.streams is True and RustChecker.streams is False


class _Recorded(PythonChecker):
    """The Python checker, real sandbox, sized to one batch per worker; records each batch's
    jobs and the verdicts it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.returned: list[tuple[list[Job], list[Verdict]]] = []

    def batch_size_for(self, n_jobs: int, workers: int) -> int:
        return n_jobs

    def check_batch(self, jobs: Sequence[Job], timeout: float, claims: Any = None) -> list[Verdict]:
        verdicts = super().check_batch(jobs, timeout, claims)
        with self.lock:
            self.returned.append((list(jobs), verdicts))
        return verdicts


#: A HumanEval-shaped problem whose right answer is `return x + 1` (the stealing tests').
INC = {
    "prompt": "def inc(x):\n",
    "test": "def check(candidate):\n    assert candidate(1) == 2\n",
    "entry_point": "inc",
}


def test_a_worker_left_idle_takes_the_jobs_queued_behind_an_endless_one() -> None:
    """12 samples on two workers, two batches of 6, an endless sample first in one of them: the
    worker whose batch ends first takes the 5 samples queued behind the endless one instead of
    idling until its timeout. Each sample is judged once, by one batch, with the verdict it
    gets alone. (A real sandbox, ~5 s. The endless sample's limit is CPU time, 3 s, some six
    times what the other batch needs, so load slows both alike and the steal still comes first.)"""
    problem = INC
    endless = "    while True:\n        pass\n"
    right = [Job("t/0", problem, f"    return x + 1  # {i}\n") for i in range(11)]
    jobs = [Job("t/0", problem, endless), *right]
    checker = _Recorded()
    verdicts = checker.check(jobs, workers=2, timeout=3)
    assert [v.error_type for v in verdicts] == ["timeout"] + [None] * 11
    assert all(v.passed for v in verdicts[1:])
    victim = [(j, v) for j, v in checker.returned if j[0].completion == endless]
    assert [len(v) for _, v in victim] == [1], checker.returned  # it kept only the endless one
    judged = [id(job) for batch, returned in checker.returned for job in batch[: len(returned)]]
    assert sorted(judged) == sorted(map(id, jobs))  # every sample once


class _Watched(Claims):
    """A batch's claims that keep their directory, and the items claimed there (by the driver or
    by a worker that took them) when the batch ended."""

    directory: Path
    claimed: set[int] | None = None

    def open(self, directory: Path) -> list[str]:
        self.directory = directory
        return super().open(directory)

    def close(self) -> int:
        if self.claimed is None:
            self.claimed = {int(name) for name in os.listdir(self.directory)}
        return super().close()


def _driver_pid(io_dir: Path) -> int:
    """The host pid of the batch driver that reads `io_dir`'s spec: the process bubblewrap
    started (the driver's forks have its command line too, under another parent)."""
    spec = str(io_dir / "spec.json").encode()
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            parent = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[1]
            if spec in argv and Path(f"/proc/{int(parent)}/comm").read_text().strip() == "bwrap":
                return int(entry)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no driver for {io_dir}")


def test_a_driver_killed_after_its_tail_was_taken_leaves_each_sample_one_outcome() -> None:
    """A batch of 10 whose second sample blocks: once it has run `Claims.STUCK_S`, a worker takes
    the 8 behind it, then the batch's driver is killed (SIGKILL) mid-sample. The taker judges
    its 8 (each right); the killed batch ends in its one-line error, counting only the 2 it kept
    (1 finished); no sample was claimed by both; a rerun of the 10 judges all of them, and the
    killed batch's claims go with its io directory. (A real sandbox, ~3 s: the half second is what makes
    a sample count as stuck.)"""
    problem = INC
    blocks = "    import time\n    time.sleep(60)\n"
    right = [Job("t/0", problem, f"    return x + 1  # {i}\n") for i in range(10)]
    jobs = [right[0], Job("t/0", problem, blocks), *right[2:]]
    checker = PythonChecker()
    claims = _Watched(len(jobs))
    failure: list[BaseException] = []

    def victim() -> None:
        try:
            checker.check_batch(jobs, 3.0, claims)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            failure.append(exc)

    thread = threading.Thread(target=victim)
    thread.start()
    deadline = time.monotonic() + 20
    # Once the driver claimed the blocking sample (a slow first sample could count as stuck
    # too on a loaded machine), and then once that one counts as stuck.
    while not ((directory := getattr(claims, "directory", None)) and (directory / "1").exists()):
        assert time.monotonic() < deadline and thread.is_alive(), failure
        time.sleep(0.02)
    while not (taken := claims.take()):
        assert time.monotonic() < deadline and thread.is_alive(), failure
        time.sleep(0.05)
    assert taken == 8 and claims.kept == 2
    os.kill(_driver_pid(claims.directory.parent), signal.SIGKILL)
    stolen = checker.check_batch(jobs[claims.kept :], 3.0)
    thread.join(timeout=20)
    assert not thread.is_alive()

    assert [v.passed for v in stolen] == [True] * 8
    assert len(failure) == 1 and isinstance(failure[0], SandboxError), failure
    message = str(failure[0])
    assert "\n" not in message and "stopped after 1 of 2 commands" in message, message
    assert claims.claimed == set(range(10))  # 0 and 1 by the driver, 2-9 by the taker: each once
    rerun = _Watched(len(right))
    assert [v.passed for v in checker.check_batch(right, 3.0, rerun)] == [True] * 10
    assert rerun.kept == 10 and rerun.claimed == set(range(10))
    while claims.directory.exists():  # removed with the killed batch's io directory
        assert time.monotonic() < deadline
        time.sleep(0.05)
