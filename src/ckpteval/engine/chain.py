"""Chaining checkpoints on one engine: an engine job that has served its own checkpoint swaps in
the weights of its run's next checkpoints and serves them too (one engine per GPU slot per sweep).

Each checkpoint keeps its own engine job in Snakemake's graph (so `-f`, `-R` and `-F` plan
exactly as before: ckpteval.verbs). What changes is who does the GPU work. An engine job that has
generated its own checkpoint's cells looks at the request files of the other checkpoints of its
run and engine group that this invocation runs (written when the run started, with its
invocation token), takes each one's
claim in turn, swaps that checkpoint's weights into its running engine (ckpteval.engine.swap, checked
after every swap) and generates its cells into that checkpoint's staging directory. When that
checkpoint's own engine job runs, it waits for the claim, finds its cells staged for its model
and settings, and only writes its done file: no engine load.

A checkpoint whose model config or tokenizer differs, or one whose claim another job holds, is
left to its own job, with a log line saying why. One not consolidated yet is waited for, up to the
seconds the chain's own engine took to start (ckpteval.engine.job._chain), then left to its own job.
A failed swap skips that checkpoint (its own job starts a fresh engine for it); the next swap
loads every weight again and is checked like any other.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.io import read_json
from ckpteval.plan.layout import (
    ROUND,
    Layout,
    claim_path,
    done_path,
    request_glob,
    staged_paths,
    staging_of,
)

log = logging.getLogger("ckpteval.engine.chain")


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint's share of an engine group: where its cells go and which it needs."""

    run: str
    ckpt: str
    staging: Path
    request: Path
    model_dir: Path
    manifest: Path
    cells: list[dict[str, Any]]

    @property
    def claim_path(self) -> Path:
        return claim_path(self.staging)


@contextlib.contextmanager
def claim(staging: Path, *, wait: bool) -> Iterator[bool]:
    """Hold a checkpoint group's claim (an flock) while generating for it: yields False without
    waiting if `wait` is off and another job holds it."""
    path = claim_path(staging)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _step_key(name: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", name)
    return (int(digits[-1]) if digits else -1, name)


def scan(
    out: Path, run: str, ckpt: str, group_dir: str, invocation: str
) -> tuple[list[Checkpoint], list[str]]:
    """The other checkpoints of `run` whose engine jobs of this group have cells to generate in
    this invocation, consolidated already, in step order after `ckpt` first, then before it;
    and the names of those not consolidated yet (a chain may wait for them)."""
    found, pending = [], []
    layout = Layout(str(out))
    for request in Path(layout.staging_of(run)).glob(request_glob(group_dir)):
        name, match = request.parent.name, ROUND.match(request.name)
        if match is None:  # not a request file: not ours to serve
            continue
        token = match["token"]
        try:
            body = read_json(request)
            staging = staging_of(request)
        except Exception:  # noqa: BLE001 - not a request file of this group: not ours to serve
            continue
        manifest = Path(layout.manifest(run, name))
        if staging.name != group_dir or name == ckpt:
            continue
        if body.get("invocation") != invocation or not body.get("cells"):
            continue
        if done_path(staging, token).exists():  # its engine job has run in this invocation
            continue
        if not manifest.exists():
            pending.append(name)
            continue
        found.append(
            Checkpoint(
                run,
                name,
                staging,
                request,
                manifest.with_suffix(""),
                manifest,
                list(body["cells"]),
            )
        )
    mine = _step_key(ckpt)
    return sorted(found, key=lambda c: (_step_key(c.ckpt) < mine, _step_key(c.ckpt))), pending


def staged_current(staging: Path, cell: Any, model_hash: Any, invocation: Any) -> bool:
    """A cell (ckpteval.jobs.CellJob) already staged for these settings and this model, in this
    invocation (by a chain that went ahead); anything else in a staging directory is a leftover."""
    jsonl, meta = staged_paths(staging, cell.key.task, cell.key.variant)
    try:
        recorded = read_json(meta)
    except Exception:  # noqa: BLE001 - missing or half-written: not staged
        return False
    return (
        jsonl.exists()
        and recorded.get("identity") == cell.identity.digest
        and recorded.get("model_hash") == model_hash
        and recorded.get("staged_for") == invocation
    )
