"""Statistics over per-sample verdicts: unbiased pass@k and standard errors.

pass@k for one problem with n samples of which c pass is 1 - C(n-c, k) / C(n, k) (Chen et al.,
2021), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) so large n does not overflow; it is 1 when
n - c < k. A cell's pass@k is the mean over problems, with the standard error of that mean.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence


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
    var = sum((v - mean) ** 2 for v in values()) / (n - 1)
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
