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
    (`_spread`), so that a problem's samples go to several workers."""
    timeout = timeout or checker.default_timeout
    workers = max(1, workers)
    size = max(1, checker.batch_size_for(window, workers))
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
            taken, batch = _spread(batch, n)
            future = pool.submit(checker.check_batch, [job for *_, job in taken], timeout)
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
