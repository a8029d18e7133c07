"""How a checker's `check` and `check_stream` spread jobs over workers: batches started as they
fill (or as a worker would idle), verdicts yielded in order, memory bounded by a window; and for a
checker that does not stream, `check` calls on consecutive chunks."""

from __future__ import annotations

import contextlib
import itertools
import queue
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckpteval.checkers.records import Job, OnVerdicts, Verdict

if TYPE_CHECKING:
    from ckpteval.checkers.base import Checker
    from ckpteval.sandbox import Claims

#: How often a worker left idle looks again for jobs a running batch has not started, when it
#: found none to take (the batch was still being set up, or had started them all).
STEAL_POLL_S = 0.05


def stream(
    checker: Checker,
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
    is spread over all of them). Its jobs are spread over those held, not consecutive
    (`_spread`), so that a problem's samples go to several workers.

    A worker left with nothing to start takes, from a running batch of a checker that
    `takes_claims`, the later half of the jobs it has not started (`Claims.take`) and runs
    them as a batch of its own: the samples queued behind an endless one no longer wait for it
    while that worker idles. The running batch then returns the verdicts of the jobs it kept,
    so each job gets one verdict, from one batch."""
    timeout = timeout or checker.default_timeout
    workers = max(1, workers)
    size = max(1, checker.batch_size_for(window, workers))
    ahead = workers if size > 1 else window  # batches started at once (run or queued)
    tail = size  # a batch's size once the input has ended
    source = enumerate(items)
    slots: deque[_Slot] = deque()  # items read and not yet yielded, in order
    batch: list[_Entry] = []  # jobs read and not yet started
    held = held_chars = 0  # jobs read and not yet checked, and their characters
    exhausted = False
    running = _Running(checker, workers, timeout)
    with running.pool, cancel_on_error(running.batches):

        def start(n: int) -> None:
            nonlocal batch
            taken, batch = _spread(batch, n)
            running.launch(taken)

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
                    while _full(len(batch), size, ahead - len(running.batches)):
                        start(size)
            while batch and len(running.batches) < ahead:
                free = ahead - len(running.batches)
                start(tail if exhausted else min(size, -(-len(batch) // free)))
            idle = len(running.batches) < ahead  # nothing to start: take unstarted jobs
            while idle and running.steal():
                idle = len(running.batches) < ahead
            while slots and slots[0].verdict is not None:
                yield slots.popleft().verdict  # type: ignore[misc]
            if not slots:
                if exhausted:
                    return
                continue
            for entries, verdicts in running.collect(idle):
                for (_, slot, job), verdict in zip(entries, verdicts, strict=True):
                    slot.verdict = verdict
                    held, held_chars = held - 1, held_chars - len(job.completion)
                if on_verdicts:
                    on_verdicts(
                        [(index, verdict) for (index, *_), verdict in zip(entries, verdicts)]
                    )


#: A job of a stream: its index among the items, its slot, the job.
_Entry = tuple[int, "_Slot", Job]


class _Running:
    """The batches a stream started and has not collected: their jobs, in the order they
    started, and the claims (`ckpteval.sandbox.Claims`) of those whose unstarted jobs a worker
    left idle may take (a checker that `takes_claims`)."""

    def __init__(self, checker: Checker, workers: int, timeout: float) -> None:
        self.checker, self.timeout = checker, timeout
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.batches: dict[Future[list[Verdict]], tuple[int, list[_Entry]]] = {}
        self.claims: dict[Future[list[Verdict]], Claims] = {}
        self.finished: queue.SimpleQueue[Future[list[Verdict]]] = queue.SimpleQueue()
        self.order = itertools.count()  # of the batches' starts

    def launch(self, entries: list[_Entry]) -> None:
        """Start a batch of these jobs on the pool."""
        jobs = [job for *_, job in entries]
        if self.checker.takes_claims:
            from ckpteval.sandbox import Claims

            claims = Claims(len(jobs))
            future = self.pool.submit(self.checker.check_batch, jobs, self.timeout, claims)  # type: ignore[call-arg]
            self.claims[future] = claims
        else:
            future = self.pool.submit(self.checker.check_batch, jobs, self.timeout)
        self.batches[future] = (next(self.order), entries)
        future.add_done_callback(self.finished.put)

    def steal(self) -> bool:
        """Start a batch of the jobs a running batch has not started, taken from it (the oldest
        batch first); whether there were any."""
        for future in sorted(self.claims, key=lambda f: self.batches[f][0]):
            taken = self.claims[future].take()
            if taken:
                number, entries = self.batches[future]
                self.batches[future] = (number, entries[:-taken])
                self.launch(entries[-taken:])
                return True
        return False

    def collect(self, idle: bool) -> Iterator[tuple[list[_Entry], list[Verdict]]]:
        """The jobs and verdicts of the batches that finished, once one has, in the order they
        started, each yielded before the next one's failure raises. With a worker `idle`, after
        `STEAL_POLL_S` at most (then perhaps none), for it to look again for jobs to take."""
        try:
            done = [self.finished.get(timeout=STEAL_POLL_S if idle and self.claims else None)]
        except queue.Empty:
            return
        while not self.finished.empty():
            done.append(self.finished.get_nowait())
        for future in sorted(done, key=lambda f: self.batches[f][0]):
            verdicts = future.result()
            self.claims.pop(future, None)
            yield self.batches.pop(future)[1], verdicts


def chunked(
    checker: Checker,
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
            yield from _check_chunk(
                checker, chunk, first, workers=workers, timeout=timeout, on_verdicts=on_verdicts
            )
            first, chunk, chars = first + len(chunk), [], 0
    yield from _check_chunk(
        checker, chunk, first, workers=workers, timeout=timeout, on_verdicts=on_verdicts
    )


def _check_chunk(
    checker: Checker,
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
        checker.check(
            [chunk[i] for i in todo],
            workers=workers,  # type: ignore[misc]
            timeout=timeout,
            on_verdicts=listener if on_verdicts else None,
        )
    )
    for item in chunk:
        yield next(checked) if isinstance(item, Job) else item


def _spread(held: list[Any], n: int) -> tuple[list[Any], list[Any]]:
    """`n` of the `held` jobs, spread evenly over them (the oldest always among them), and the
    others, both in order. A problem's samples come one after another and tend to behave alike
    (all endless, all slow): a batch of consecutive jobs would hold them all, and its worker
    would run their timeouts one after another while the other workers idle at the end."""
    if n >= len(held):
        return held, []
    picked = [i * len(held) // n for i in range(n)]
    rest: list[Any] = []
    for before, after in zip([-1, *picked], [*picked, len(held)]):
        rest += held[before + 1 : after]  # slices: a start costs O(n) steps, as `held[n:]` did
    return [held[i] for i in picked], rest


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
