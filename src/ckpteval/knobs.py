"""Runtime knobs: the one way a workflow step reads `snakemake.config`.

A step's result-affecting settings come from its identity param (ckpteval.jobs); what is left in
the config for it are knobs that change how fast or where it runs (worker counts, memory
fractions, chunk sizes, GPUs, endpoint concurrency), the contract's `none` rows. `runtime`
reads such a key and refuses any other, so a step cannot make its output depend on a setting
that does not rerun it. tests/test_identity_bound.py checks that steps read the config nowhere
else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpteval.contract import CONTRACT, NONE, Row, lookup


class NotAKnob(KeyError):
    """A step asked `runtime` for a key that changes results (a bug in the step, not the
    user's config): such a key belongs in the job's identity."""


def _covers(pattern: str, key: str) -> bool:
    """Whether contract row `pattern` (with `*` for a map's entries) is `key` or lies under it."""
    row, wanted = pattern.split("."), key.split(".")
    if len(row) < len(wanted):
        return False
    return all(r == "*" or r == w for r, w in zip(row, wanted))


def rows_under(key: str) -> list[Row]:
    """The contract rows of `key` (a concrete key, e.g. `runs.demo.endpoint.concurrency`) and of
    every key below it: a section is a knob only if everything in it is."""
    return [row for row in CONTRACT if _covers(row.key, key)]


def check_knob(key: str) -> None:
    """Raise `NotAKnob` unless `key` and everything under it has contract effect `none`."""
    rows = rows_under(key)
    if not rows:
        raise NotAKnob(f"{key}: not a config key (no rerun-contract row)")
    wider = sorted({f"{row.key} ({row.effect})" for row in rows if row.effect != NONE})
    if wider:
        raise NotAKnob(
            f"{key}: not a runtime knob, it changes results ({', '.join(wider)}); "
            "read it from the job's identity"
        )


def runtime(config: Mapping[str, Any], key: str) -> Any:
    """The value of knob `key` (dotted) in the job's validated config, or None when unset.

    Only keys whose contract effect is `none` are served (`NotAKnob` otherwise): a knob's value
    never reruns a job, so it must never change one's output."""
    check_knob(key)
    return lookup(config, key)
