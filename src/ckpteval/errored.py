"""How each number of a reward cell counts the samples its reward function gave no score.

A reward cell (`ckpteval.evaluate.RewardTotals`) states it per metric entry, and this module reads
it back, so that every place that speaks of errored samples (`ckpteval status`, `metrics.md`, the
report and its plots, `ckpteval score`, `ckpteval compare`) says what the number it shows does
with them, with that number's own counts, never a fixed sentence that can be wrong:

- `excludes_errors: k`: the mean is over the `n` samples that returned a score, `k` left out
  (`EXCLUDED`: the scores' range is unknown; such a number can flatter);
- `errors_at: [lo, hi]` with `includes_errors: k`: the `k` count in `n` at `lo` (`BOTTOM`);
- `pass@k` of a cell with errored samples: an errored sample is a failed one (`FAILURE`).

`reward_error_rate` (share of the cell's samples with no score, over all of them) says how many
errored in all (`no_score`). Other metrics (`reward_extra/<key>`, over the samples that return
the key; the length metrics, from the generation lines) do not describe scores of errored
samples and are not listed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Left out of the mean: `n` counts the samples that returned a score.
EXCLUDED = "excluded"
#: Counted in `n` at the bottom of the scores' known range (`at`).
BOTTOM = "bottom"
#: Counted as failed samples (pass@k).
FAILURE = "failure"
#: The cell metric whose entry says how many of all samples errored.
REWARD_ERROR_RATE = "reward_error_rate"
_PASS_AT = re.compile(r"pass@\d+$")


@dataclass(frozen=True)
class Errored:
    """How one number counts errored samples: `count` of them, `how` (`EXCLUDED`, `BOTTOM`,
    `FAILURE`), the number's own `n` (for `EXCLUDED` the samples that returned a score, for
    `BOTTOM` every sample; unused for `FAILURE`, whose `n` counts problems), `at` the value they
    count at (`BOTTOM`), and `seeds`, when the number is a mean over seeds, those whose samples
    the counts add up (named in `words`)."""

    count: int
    how: str
    n: int = 0
    at: float = math.nan
    seeds: tuple[int, ...] = ()

    def mark(self) -> str:
        """A few words beside the number in a table: "excludes 6 of 20 errored"."""
        if self.how == EXCLUDED:
            return f"excludes {self.count} of {self.n + self.count} errored"
        if self.how == BOTTOM:
            return f"{self.count} of {self.n} errored, counted as {self.at:g}"
        return f"{self.count} errored, counted as failures"

    def words(self, metric: str) -> str:
        """What `metric`'s number does with its errored samples, in one clause."""
        where = ""
        if self.seeds:
            where = f" (seed{'s' if len(self.seeds) > 1 else ''} {' '.join(map(str, self.seeds))})"
        one = self.count == 1
        if self.how == EXCLUDED:
            scored = "sample that" if self.n == 1 else "samples that"
            return (
                f"{metric}{where}: mean over the {self.n} {scored} returned a score; "
                f"{self.count} of {self.n + self.count} errored and {'is' if one else 'are'} "
                "excluded"
            )
        if self.how == BOTTOM:
            return (
                f"{metric}{where}: {self.count} of {self.n} samples errored and "
                f"{'counts' if one else 'count'} as {self.at:g}, the bottom of the scores' range"
            )
        if one:
            return f"{metric}{where}: its 1 errored sample counts as a failure"
        return f"{metric}{where}: its {self.count} errored samples count as failures"


def no_score(metrics: Mapping[str, Any]) -> tuple[int, int] | None:
    """(errored, all) samples of a cell file's `metrics` (its `reward_error_rate`; errored may
    be 0), or None when it is not a reward cell."""
    entry = metrics.get(REWARD_ERROR_RATE)
    try:
        n = int(entry["n"])
        return (round(float(entry["value"]) * n), n)
    except (KeyError, TypeError, ValueError):
        return None


def errored_metrics(metrics: Mapping[str, Any]) -> dict[str, Errored]:
    """Metric -> how it counts errored samples, for the metrics of a cell file's `metrics` that
    count any (see the module's docstring), in the cell's order."""
    cell = no_score(metrics)
    out: dict[str, Errored] = {}
    for name, entry in metrics.items():
        if not isinstance(entry, Mapping):
            continue
        n = entry.get("n")
        n = n if isinstance(n, int) and not isinstance(n, bool) else 0
        excluded = _count(entry.get("excludes_errors"))
        included = _count(entry.get("includes_errors"))
        at = entry.get("errors_at")
        if excluded:
            out[name] = Errored(excluded, EXCLUDED, n)
        elif included and isinstance(at, Sequence) and at and _number(at[0]):
            out[name] = Errored(included, BOTTOM, n, float(at[0]))
        elif cell and cell[0] and _PASS_AT.match(name):
            out[name] = Errored(cell[0], FAILURE, n)
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
