"""Split checkpoints between machines without a scheduler: `--config shard=i/n`.

Two nodes without Slurm each run their own Snakemake on the shared filesystem, one with `shard=0/2`
and one with `shard=1/2`; each evaluates the checkpoints whose stable hash falls in its shard, and a
final run without `shard` aggregates. A checkpoint's shard depends only on its run and name, never
on which other checkpoints exist, so a checkpoint written later lands on the same node in every
invocation and two nodes never evaluate the same checkpoint. The price is balance: a hash splits
n checkpoints binomially, not exactly in halves.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from ckpteval.errors import UserError

T = TypeVar("T")

_SHARD_RE = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*\Z")


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (0-based): `Shard(1, 2)` is the second half."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise UserError(
                f"config: shard: {self.index}/{self.count} is not a shard; use i/n with "
                "0 <= i < n, e.g. shard=0/2 on one node and shard=1/2 on the other"
            )

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, run: str, ckpt: str) -> bool:
        """Whether checkpoint `ckpt` of run `run` is evaluated by this shard."""
        return shard_index(run, ckpt, self.count) == self.index


def parse_shard(value: object) -> Shard | None:
    """The `shard` config value (`"0/2"`; None or "" means unsharded) as a `Shard`."""
    if value is None or value == "":
        return None
    match = _SHARD_RE.match(str(value))
    if match is None:
        raise UserError(
            f"config: shard: {value!r} is not of the form i/n; pass e.g. --config shard=0/2"
        )
    return Shard(int(match.group(1)), int(match.group(2)))


def shard_index(run: str, ckpt: str, count: int) -> int:
    """The shard (0..count-1) of one checkpoint: SHA-256 of `run/ckpt`, stable across machines.

    Python's `hash()` is salted per process; two nodes must agree, hence a cryptographic digest.
    """
    digest = hashlib.sha256(f"{run}/{ckpt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def select(items: Iterable[T], run: str, shard: Shard | None, *, name: str = "name") -> list[T]:
    """The items (checkpoints of run `run`, named by attribute `name`) this shard owns, in order.

    With no shard every item is kept, so callers need no special case for unsharded runs.
    """
    if shard is None:
        return list(items)
    return [item for item in items if shard.owns(run, getattr(item, name))]
