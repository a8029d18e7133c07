"""Tail assist: GPUs left idle at the end of a sweep help the infer jobs still running.

A sweep's last wave rarely fills every GPU: 30 checkpoints on 8 GPUs end with 6 jobs running and 2
devices idle for most of a job's length, and nothing before a job runs tells which one will be
longest. So an infer job publishes the requests it still has to generate, already cut into the
chunks it generates them in, on a *board*; an assist job (one per spare GPU, started by Snakemake
only once every infer job has a device) joins the board with the most work left, loads its own
engine for that checkpoint and generates chunks from the back while the job works from the front.
Both append to the same content-addressed cache, so the job's generation files are what it would
have written alone; its `.meta.json` counts the requests an assistant generated.

Layout, under the sweep's cache directory:

    .boards/<job>@<host>-<pid>/board.json      what an assistant needs (model dir, engine settings,
                                               backend identity, chunk count); written last
                              chunks/<i>.json  chunk i: a list of requests (payloads are opaque here)
                              claims/<i>       who generates chunk i; created exclusively, so one owner
                              done/<i>.json    chunk i is in the cache; its engine seconds
                              owners/<who>     flock held by each live participant
                              progress.json    the job's load seconds and its generation rate so far

The job claims chunks in order, an assistant takes the last unclaimed one. Nothing is lost on a
kill: when a chunk's claimant dies before `done/<i>.json` (its flock is free), the job takes the
chunk back and generates it itself; when the job dies, assistants leave its board, and its retry
publishes a fresh one (stale boards of the same job are removed). Only the job removes a board.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.io import write_json

log = logging.getLogger("ckpteval.engine.assist")

BOARDS = ".boards"
MAIN = "main"


def boards_root(cache_dir: Path) -> Path:
    return Path(cache_dir) / BOARDS


class Board:
    """One infer job's published chunks, seen by the job (`owner == "main"`) or an assistant."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        self._fd: int | None = None

    # -- participants ------------------------------------------------------------------------

    @classmethod
    def publish(cls, root: Path, job: str, info: dict[str, Any], chunks: Sequence[Any]) -> Board:
        """The job's side: write every chunk, then `board.json` (assistants only see boards that
        have it). Boards of the same `job` whose job died are removed first."""
        root.mkdir(parents=True, exist_ok=True)
        safe = job.replace("/", "~")
        for stale in root.glob(f"{glob_escape(safe)}@*"):
            board = cls(stale, MAIN)
            if not board.alive(MAIN):
                shutil.rmtree(stale, ignore_errors=True)
        path = root / f"{safe}@{socket.gethostname()}-{os.getpid()}"
        shutil.rmtree(path, ignore_errors=True)
        for sub in ("chunks", "claims", "done", "owners"):
            (path / sub).mkdir(parents=True)
        board = cls(path, MAIN)
        board._hold()
        for i, chunk in enumerate(chunks):
            write_json(path / "chunks" / f"{i}.json", chunk)
        write_json(
            path / "board.json",
            {
                **info,
                "job": job,
                "chunks": len(chunks),
                "host": socket.gethostname(),
                "pid": os.getpid(),
            },
        )
        return board

    @classmethod
    def join(cls, path: Path, owner: str) -> Board:
        """An assistant's side: hold an owner lock so the job can tell it is alive."""
        board = cls(path, owner)
        board._hold()
        return board

    def _hold(self) -> None:
        fd = os.open(self.path / "owners" / self.owner, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd

    def leave(self) -> None:
        """Release this participant's lock; the job also removes the board."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.owner == MAIN:
            shutil.rmtree(self.path, ignore_errors=True)

    def alive(self, owner: str | None) -> bool:
        """Whether `owner` still holds its lock (False for nobody)."""
        if not owner:
            return False
        if owner == self.owner and self._fd is not None:
            return True
        try:
            fd = os.open(self.path / "owners" / owner, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def helpers(self) -> int:
        """Live assistants on this board."""
        owners = self.path / "owners"
        return (
            sum(1 for p in owners.iterdir() if p.name != MAIN and self.alive(p.name))
            if owners.is_dir()
            else 0
        )

    # -- chunks ------------------------------------------------------------------------------

    @property
    def info(self) -> dict[str, Any]:
        return _load(self.path / "board.json")

    def chunk(self, index: int) -> Any:
        return _load(self.path / "chunks" / f"{index}.json")

    def claimant(self, index: int) -> str | None:
        try:
            return (self.path / "claims" / str(index)).read_text() or None
        except FileNotFoundError:
            return None

    def claim(self, index: int) -> bool:
        """Take chunk `index` unless someone else has it (claiming one's own chunk again is fine)."""
        path = self.path / "claims" / str(index)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return self.claimant(index) == self.owner
        try:
            os.write(fd, self.owner.encode())
        finally:
            os.close(fd)
        return True

    def take_back(self, index: int) -> None:
        """The job's side: make a dead assistant's chunk its own."""
        tmp = self.path / "claims" / f".{index}.{os.getpid()}"
        tmp.write_text(self.owner)
        os.replace(tmp, self.path / "claims" / str(index))

    def unclaimed(self, total: int | None = None) -> list[int]:
        n = self.info["chunks"] if total is None else total
        taken = {p.name for p in (self.path / "claims").iterdir()}
        return [i for i in range(n) if str(i) not in taken]

    def claim_last(self) -> int | None:
        """An assistant's next chunk: the last unclaimed one, or None."""
        for index in reversed(self.unclaimed()):
            if self.claim(index):
                return index
        return None

    def mark_done(self, index: int, seconds: float) -> None:
        write_json(self.path / "done" / f"{index}.json", {"by": self.owner, "seconds": seconds})

    def done(self, index: int) -> dict[str, Any] | None:
        try:
            return _load(self.path / "done" / f"{index}.json")
        except FileNotFoundError:
            return None

    # -- progress ----------------------------------------------------------------------------

    def report(self, load_seconds: float, engine_seconds: float, cost_done: int) -> None:
        """The job's side: what an assistant needs to price the work left (`cost_done`: the
        `chunk_cost` of the chunks it generated in `engine_seconds`)."""
        write_json(
            self.path / "progress.json",
            {
                "load_seconds": load_seconds,
                "engine_seconds": engine_seconds,
                "cost_done": cost_done,
                "at": time.time(),
            },
        )

    def progress(self) -> dict[str, Any]:
        try:
            return _load(self.path / "progress.json")
        except FileNotFoundError:
            return {}


def _load(path: Path) -> Any:
    """A board file (written atomically); FileNotFoundError once the job removed its board."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def live_boards(root: Path) -> Iterator[Board]:
    """Published boards whose job is alive, as seen from outside."""
    if not root.is_dir():
        return
    for path in sorted(root.iterdir()):
        if (path / "board.json").exists():
            board = Board(path, "observer")
            if board.alive(MAIN):
                yield board


def work_through(
    board: Board | None,
    indices: Sequence[int],
    generate: Callable[[int], None],
    *,
    poll_seconds: float = 0.5,
) -> list[tuple[int, float]]:
    """The job's side: generate (`generate(i)`, which also marks it done) every chunk of
    `indices` no assistant claimed, in order; then wait for the assistants' chunks, generating
    those of one that died here. Returns the assistants' finished chunks with their engine
    seconds."""
    mine = []
    for index in indices:
        if board is None or board.claim(index):
            generate(index)
            mine.append(index)
    if board is None:
        return []
    mine_set = set(mine)
    pending = [i for i in indices if i not in mine_set]
    if pending:
        log.info("waiting for %d chunk(s) assist jobs are generating", len(pending))
    finished: list[tuple[int, float]] = []
    while pending:
        for index in list(pending):
            done = board.done(index)
            if done is not None:
                finished.append((index, float(done["seconds"])))
                pending.remove(index)
            elif not board.alive(board.claimant(index)):
                log.warning("the assist job generating chunk %d stopped; generating it here", index)
                board.take_back(index)
                generate(index)
                pending.remove(index)
        if pending:
            time.sleep(poll_seconds)
    return finished


@dataclass(frozen=True)
class Offer:
    """What helping one board is worth: expected engine seconds left on chunks nobody claimed."""

    board: Board
    remaining_seconds: float | None
    unclaimed: int
    helpers: int
    #: The job's engine load, what a helper's own load is expected to cost (None: not loaded yet).
    load_seconds: float | None = None

    @property
    def share(self) -> float:
        """Seconds of work one more helper could expect to take (unknown rate: chunks count)."""
        left = (
            self.remaining_seconds if self.remaining_seconds is not None else float(self.unclaimed)
        )
        return left / (2 + self.helpers)


def offers(root: Path, boards: Iterable[Board] | None = None) -> list[Offer]:
    """Every live board with unclaimed chunks (of `boards` if the caller already listed
    `live_boards(root)`), priced from its job's progress so far.

    A job still loading has no rate yet: its work is priced at the median rate of the jobs that
    have one, so every offer is in seconds and the largest wins. Only when no job has a rate
    are offers left unpriced (`remaining_seconds` None: compared by chunks)."""
    seen = []
    for board in live_boards(root) if boards is None else boards:
        try:
            info = board.info
            unclaimed = board.unclaimed(info["chunks"])
            helpers = board.helpers()
        except FileNotFoundError:
            continue  # the job finished and removed it meanwhile
        if len(unclaimed) < 2:
            continue  # the job takes the last one itself sooner than a new engine loads
        costs = info.get("chunk_cost") or [1] * info["chunks"]
        prog = board.progress()
        rate = prog["engine_seconds"] / prog["cost_done"] if prog.get("cost_done") else None
        seen.append(
            (
                board,
                sum(costs[i] for i in unclaimed),
                rate,
                len(unclaimed),
                helpers,
                prog.get("load_seconds"),
            )
        )
    known = sorted(rate for _, _, rate, _, _, _ in seen if rate is not None)
    fallback = known[len(known) // 2] if known else None
    out = []
    for board, left, rate, unclaimed, helpers, load in seen:
        rate = rate if rate is not None else fallback
        out.append(
            Offer(board, left * rate if rate is not None else None, unclaimed, helpers, load)
        )
    return out


def worth_helping(offer: Offer, load_seconds: float) -> bool:
    """Helping saves about the helper's share of the work minus its engine load."""
    if offer.remaining_seconds is None:
        # Nothing measured yet (the job is still loading): join if every participant would
        # still get two chunks.
        return offer.unclaimed >= 2 * (offer.helpers + 2)
    return offer.share > 1.5 * load_seconds


@dataclass
class AssistStats:
    boards: int = 0
    chunks: int = 0
    requests: int = 0
    engine_seconds: float = 0.0
    load_seconds: float = 0.0
    error: str | None = None


class Engine:
    """What an assistant needs from a backend for one board (loaded when `assist` gets it)."""

    def generate_chunk(self, chunk: Any) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


def assist(
    root: Path,
    name: str,
    open_engine: Callable[[Board], Engine | None],
    *,
    default_load_seconds: float = 60.0,
    grace_seconds: float = 30.0,
    poll_seconds: float = 2.0,
) -> AssistStats:
    """Help the boards under `root` until none is worth an engine load; returns what was done.

    `open_engine(board)` returns an engine for the board's model (None: this assistant cannot
    serve it, e.g. another backend identity); its `generate_chunk` generates a chunk, appends it
    to the cache and returns how many requests it held. Until it sees a first board, an
    assistant waits up to `grace_seconds` (jobs publish theirs a few seconds after they start);
    after that it ends as soon as no board is worth helping, so it never holds a sweep's end.
    """
    stats = AssistStats()
    skipped: set[Path] = set()
    started = time.monotonic()
    seen_board = False
    while True:
        boards = list(live_boards(root))
        seen_board = seen_board or bool(boards)
        candidates = [o for o in offers(root, boards) if o.board.path not in skipped]
        best = max(candidates, key=lambda o: o.share, default=None)
        if best is None or not worth_helping(
            best, float(best.load_seconds or default_load_seconds)
        ):
            if seen_board or time.monotonic() - started > grace_seconds:
                return stats
            time.sleep(poll_seconds)
            continue
        try:
            board = Board.join(best.board.path, name)
        except FileNotFoundError:
            continue  # the job finished meanwhile
        try:
            log.info(
                "helping %s: %d chunks unclaimed, ~%s s left, %d other helper(s)",
                board.info["job"],
                best.unclaimed,
                f"{best.remaining_seconds:.0f}" if best.remaining_seconds is not None else "?",
                best.helpers,
            )
            _help(board, open_engine, stats)
        except FileNotFoundError:
            log.info("%s finished meanwhile", board.path.name)
        except Exception as exc:  # noqa: BLE001 - a helper's failure must not fail the sweep
            # The job sees this helper's lock go and generates its claimed chunk itself.
            log.exception("helping %s failed; leaving its chunks to the job", board.path.name)
            stats.error = f"{type(exc).__name__}: {exc}"
            return stats
        finally:
            board.leave()
        skipped.add(board.path)


def _help(board: Board, open_engine: Callable[[Board], Engine | None], stats: AssistStats) -> None:
    engine: Engine | None = None
    job = board.info["job"]
    try:
        while board.alive(MAIN):
            if engine is None:
                # Load first, claim after: a chunk claimed during the load would keep the job
                # waiting for it if the job ran out of its own chunks meanwhile.
                started = time.monotonic()
                engine = open_engine(board)
                stats.load_seconds += time.monotonic() - started
                if engine is None:
                    return
                stats.boards += 1
            index = board.claim_last()
            if index is None:
                return
            started = time.monotonic()
            stats.requests += engine.generate_chunk(board.chunk(index))
            seconds = time.monotonic() - started
            board.mark_done(index, seconds)
            stats.chunks += 1
            stats.engine_seconds += seconds
            log.info("chunk %d of %s done in %.1f s", index, job, seconds)
    finally:
        if engine is not None:
            engine.close()
