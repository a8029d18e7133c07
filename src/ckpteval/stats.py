"""Statistics across cells: paired bootstrap deltas, pooled pass@k, seed spread.

`ckpteval.metrics` owns the per-problem estimators (unbiased pass@k, the standard error of a mean);
this module applies them to many cells at once, vectorised with numpy so a sweep of a million
per-sample rows aggregates in seconds.

The unit of resampling is the problem, never the sample: the samples of one problem (several
generations, several seeds) are correlated, and the question a user asks ("is step 1800 better than
step 1200?") is about the population of problems the benchmark was drawn from.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np

from ckpteval.metrics import pass_at_k


@dataclass(frozen=True)
class BootstrapResult:
    """Per comparison (one entry per column of the input): estimate and percentile interval."""

    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n_problems: np.ndarray


def bootstrap_weights(n_items: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Multiplicities of `n_boot` resamples with replacement of `n_items` items: (n_boot, n_items).

    Row b counts how often each item was drawn in resample b; every row sums to `n_items`. Weights
    instead of index arrays let one matrix product evaluate every resample of every comparison.
    """
    draws = rng.integers(0, n_items, size=(n_boot, n_items))
    offsets = (np.arange(n_boot) * n_items)[:, None]
    counts = np.bincount((draws + offsets).ravel(), minlength=n_boot * n_items)
    return counts.reshape(n_boot, n_items).astype(np.float64)


def paired_bootstrap(
    per_problem: np.ndarray, *, n_boot: int, rng: np.random.Generator, confidence: float = 0.95
) -> BootstrapResult:
    """Mean of per-problem paired differences with a percentile bootstrap interval, per column.

    `per_problem` is (n_problems, n_comparisons): entry (p, j) is comparison j's mean difference
    on problem p over the samples both sides share, NaN where they share none. Problems are
    resampled with replacement; a resample's statistic is the mean over the drawn problems that
    are present (a ratio of weighted sums), so columns with different problem sets share one
    set of resamples. Sharing resamples correlates the intervals of different comparisons with each
    other but leaves each interval's own coverage unchanged. A column with one problem gets a
    zero-width interval; one with none gets NaN.
    """
    if per_problem.ndim != 2:
        raise ValueError(f"per_problem must be 2-D, got shape {per_problem.shape}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    present = ~np.isnan(per_problem)
    values = np.where(present, per_problem, 0.0)
    n_present = present.sum(axis=0)
    estimate = np.full(per_problem.shape[1], np.nan)
    low, high = estimate.copy(), estimate.copy()
    cols = np.flatnonzero(n_present > 0)
    if len(cols) == 0:
        return BootstrapResult(estimate, low, high, n_present)
    estimate[cols] = values[:, cols].sum(axis=0) / n_present[cols]
    weights = bootstrap_weights(per_problem.shape[0], n_boot, rng)
    with np.errstate(invalid="ignore", divide="ignore"):
        resampled = (weights @ values[:, cols]) / (weights @ present[:, cols].astype(np.float64))
    # A resample that drew none of a column's problems has no statistic (NaN): skip it there.
    tail = (1.0 - confidence) / 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column no resample drew stays NaN
        low[cols], high[cols] = np.nanquantile(resampled, [tail, 1.0 - tail], axis=0)
    return BootstrapResult(estimate, low, high, n_present)


def per_problem_means(values: np.ndarray, problem_codes: np.ndarray) -> np.ndarray:
    """Mean over the rows of each problem, ignoring NaN: (n_rows, n_cols) -> (n_problems, n_cols).

    `problem_codes` gives each row's problem as 0..n_problems-1; rows need not be sorted. A problem
    whose rows are all NaN in a column is NaN there.
    """
    order = np.argsort(problem_codes, kind="stable")
    codes = problem_codes[order]
    rows = values[order]
    if len(codes) == 0:
        return np.empty((0, values.shape[1]))
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    present = ~np.isnan(rows)
    sums = np.add.reduceat(np.where(present, rows, 0.0), starts, axis=0)
    counts = np.add.reduceat(present.astype(np.float64), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


# A sweep repeats the same few (n, c, k) millions of times: evaluate each once.
_pass_at_k = functools.lru_cache(maxsize=1 << 16)(pass_at_k)


def pass_at_k_curve(n: np.ndarray, c: np.ndarray, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pass@k over problems for each k: (mean, standard error of the mean), arrays over `ks`.

    `n[p]` samples of problem p were drawn and `c[p]` passed. Every k must be <= min(n). The
    per-problem estimator is `metrics.pass_at_k`, evaluated once per distinct (n, c, k): a sweep
    has few distinct sample counts, so this is exact and fast.
    """
    n = np.asarray(n, dtype=np.int64)
    c = np.asarray(c, dtype=np.int64)
    ks = np.asarray(ks, dtype=np.int64)
    if len(n) == 0:
        return np.full(len(ks), np.nan), np.full(len(ks), np.nan)
    if len(ks) and ks.max() > n.min():
        raise ValueError(f"k={ks.max()} exceeds the smallest sample count {n.min()}")
    pairs, inverse = np.unique(n * (c.max() + 1) + c, return_inverse=True)
    pair_n, pair_c = pairs // (c.max() + 1), pairs % (c.max() + 1)
    table = np.array(
        [[_pass_at_k(int(pn), int(pc), int(k)) for k in ks] for pn, pc in zip(pair_n, pair_c)]
    ).reshape(len(pairs), len(ks))
    per_problem = table[inverse]
    mean = per_problem.mean(axis=0)
    if len(n) < 2:
        return mean, np.zeros(len(ks))
    stderr = per_problem.std(axis=0, ddof=1) / np.sqrt(len(n))
    return mean, stderr


def conservative_stderr(stderrs: np.ndarray) -> float:
    """Standard error of the mean of several seeds' estimates on the same problems: RMS of theirs.

    Seeds share the problems, so most of each cell's standard error (problem sampling) does not
    average away; only generation noise does. The root mean square of the cells' standard errors
    bounds the seed-mean's from above, which is the honest side to err on. NaNs are ignored.
    """
    stderrs = np.asarray(stderrs, dtype=np.float64)
    stderrs = stderrs[~np.isnan(stderrs)]
    return float(np.sqrt(np.mean(stderrs**2))) if len(stderrs) else float("nan")
