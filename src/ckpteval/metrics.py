"""Statistics over per-sample verdicts: unbiased pass@k and standard errors; length and truncation.

pass@k for one problem with n samples of which c pass is 1 - C(n-c, k) / C(n, k) (Chen et al.,
2021), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) so large n does not overflow; it is 1 when
n - c < k. A cell's pass@k is the mean over problems, with the standard error of that mean.

A cell's length metrics (`LENGTH_METRICS`, `LengthTotals`) come from its generation lines, not
from its verdicts: how long the completions are and how many hit the token budget.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from statistics import NormalDist
from typing import Any

#: The cell metrics that describe generation length and truncation (`LengthTotals`): never a
#: task's main metric (`ckpteval.aggregate.tables.main_metric`).
LENGTH_METRICS = (
    "completion_tokens_mean",
    "completion_tokens_median",
    "truncation_rate",
    "reasoning_tokens_mean",
    "truncated_reasoning_rate",
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `n` samples, `c` of them correct."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n)); stderr is 0 for n < 2."""
    return _mean_and_stderr(len(values), lambda: iter(values))


def _mean_and_stderr(n: int, values: Callable[[], Iterator[float]]) -> tuple[float, float]:
    """The two-pass computation behind `mean_and_stderr`, over values that can be read twice."""
    if n == 0:
        return math.nan, math.nan
    mean = sum(values()) / n
    if n < 2:
        return mean, 0.0
    try:
        var = sum((v - mean) ** 2 for v in values()) / (n - 1)
    except OverflowError:  # a square past the float range: the spread is beyond measure
        return mean, math.inf
    return mean, math.sqrt(var / n)


class RunningMean:
    """Values added one at a time; `result()` is `mean_and_stderr` of them, bit for bit.

    The standard error's second pass sums rounded squares in input order, and a different order
    (or a one-pass formula) changes its last bits, so the values themselves are kept, compactly:
    one bit each while every value is 0 or 1 (compile rates, pass/fail scores: 125 kB per million
    samples), eight bytes each once any other value arrives.
    """

    def __init__(self) -> None:
        self.n = 0
        self._bits = bytearray()
        self._floats: array[float] | None = None

    def add(self, value: float) -> None:
        value = float(value)
        if self._floats is None and value in (0.0, 1.0):
            if self.n % 8 == 0:
                self._bits.append(0)
            if value:
                self._bits[-1] |= 1 << (self.n % 8)
        else:
            if self._floats is None:
                self._floats = array("d", self._values())
            self._floats.append(value)
        self.n += 1

    def _values(self) -> Iterator[float]:
        if self._floats is not None:
            yield from self._floats
            return
        for i in range(self.n):
            yield float(self._bits[i >> 3] >> (i & 7) & 1)

    def result(self) -> tuple[float, float]:
        """(mean, stderr), as `mean_and_stderr(values)` returns them."""
        return _mean_and_stderr(self.n, self._values)


def pass_at_k_table(
    counts: Iterable[tuple[int, int]], ks: Iterable[int] | None = None
) -> dict[int, tuple[float, float, int]]:
    """pass@k over problems given (n, c) per problem: {k: (mean, stderr, n_problems)}.

    Without `ks`, every k from 1 to the smallest n is reported; a k larger than some problem's n
    is left out rather than estimated from fewer samples.
    """
    counts = list(counts)
    if not counts:
        return {}
    min_n = min(n for n, _ in counts)
    wanted = sorted(set(ks)) if ks is not None else list(range(1, min_n + 1))
    table: dict[int, tuple[float, float, int]] = {}
    for k in wanted:
        if k < 1 or k > min_n:
            continue
        mean, stderr = mean_and_stderr([pass_at_k(n, c, k) for n, c in counts])
        table[k] = (mean, stderr, len(counts))
    return table


class LengthTotals:
    """Length and truncation of a cell's samples, from their generation lines' `finish_reason`,
    `completion_tokens` and (tasks with reasoning) `reasoning_tokens` and `truncated_reasoning`.

    Each metric counts only the samples whose line states its field: a null or missing
    `finish_reason` (replayed solutions, some endpoints) or token count is unknown, not zero, so
    such samples are left out of that metric's `n`, and a cell where no sample states it has no
    such metric at all. Any stated finish reason other than "length" (stop, abort, an endpoint's
    content filter) counts as not truncated.

    Memory: the completion and reasoning token counts are kept (8 bytes per sample each: the
    median needs them all, and the means' standard errors are computed exactly as
    `mean_and_stderr` does); truncation flags take one bit per sample (`RunningMean`).
    """

    def __init__(self) -> None:
        self.completion_tokens: array[int] = array("q")
        self.reasoning_tokens: array[int] = array("q")
        self.truncated = RunningMean()
        self.truncated_reasoning = RunningMean()

    def add(self, line: Mapping[str, Any]) -> None:
        """Count one scored sample's generation line (fields it lacks are unknown)."""
        reason = line.get("finish_reason")
        if isinstance(reason, str):
            self.truncated.add(1.0 if reason == "length" else 0.0)
        for name, values in (
            ("completion_tokens", self.completion_tokens),
            ("reasoning_tokens", self.reasoning_tokens),
        ):
            tokens = line.get(name)
            if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
                values.append(tokens)
        flag = line.get("truncated_reasoning")
        if isinstance(flag, bool):
            self.truncated_reasoning.add(1.0 if flag else 0.0)

    def metrics(self) -> dict[str, dict[str, float | int | None]]:
        """The `LENGTH_METRICS` this cell's lines support, each {"value", "stderr", "n"}.

        Means carry the standard error of the mean. The median's stderr is the distribution-free
        one of its order-statistic interval (`median_and_stderr`)."""
        out: dict[str, dict[str, float | int | None]] = {}
        for name, values in (
            ("completion_tokens_mean", self.completion_tokens),
            ("reasoning_tokens_mean", self.reasoning_tokens),
        ):
            if values:
                mean, stderr = _mean_and_stderr(len(values), lambda v=values: map(float, v))
                out[name] = {"value": mean, "stderr": stderr, "n": len(values)}
        if self.completion_tokens:
            median, stderr = median_and_stderr(self.completion_tokens)
            out["completion_tokens_median"] = {
                "value": median,
                "stderr": stderr,
                "n": len(self.completion_tokens),
            }
        for name, rate in (
            ("truncation_rate", self.truncated),
            ("truncated_reasoning_rate", self.truncated_reasoning),
        ):
            if rate.n:
                value, stderr = rate.result()
                out[name] = {"value": value, "stderr": stderr, "n": rate.n}
        return {name: out[name] for name in LENGTH_METRICS if name in out}


_Z95 = NormalDist().inv_cdf(0.975)


def median_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Median and a distribution-free standard error of it.

    The order statistics x_(l) and x_(u), ranks l = n/2 - 1.96 sqrt(n)/2 and
    u = 1 + n/2 + 1.96 sqrt(n)/2 (clamped to the sample),
    bound the normal approximation of the binomial (sign-test) 95% confidence interval of the
    median, valid for any distribution; the stderr is that interval's width / (2 x 1.96), what a
    normal interval of the same width would have. 0 for n < 2 (as `mean_and_stderr`), NaN for
    n = 0. Token counts are discrete, so the interval (and the stderr) can be 0 when most
    samples have the same length: it is an estimate, not a bound.
    """
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    ordered = sorted(values)
    half = n // 2
    median = float(ordered[half]) if n % 2 else (ordered[half - 1] + ordered[half]) / 2
    if n < 2:
        return median, 0.0
    spread = _Z95 * math.sqrt(n) / 2
    low = max(1, math.floor(n / 2 - spread))  # ranks from 1 (Conover, Practical Nonparametric
    high = min(n, math.ceil(1 + n / 2 + spread))  # Statistics, the median's confidence interval)
    return median, (float(ordered[high - 1]) - float(ordered[low - 1])) / (2 * _Z95)
