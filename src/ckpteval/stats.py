"""Statistics across cells: intervals, paired bootstrap deltas, McNemar's exact test with Holm's
correction, pooled pass@k, seeds.

`ckpteval.metrics` owns the per-problem estimators (unbiased pass@k, the standard error of a mean);
this module applies them to many cells at once, vectorised with numpy so a sweep of a million
per-sample rows aggregates in seconds.

The unit of resampling is the problem, never the sample: the samples of one problem (several
generations, several seeds) are correlated, and the question a user asks ("is step 1800 better than
step 1200?") is about the population of problems the benchmark was drawn from. For the same
reason the unit of McNemar's test is the problem (`paired_flips`): its samples are not independent
pairs. The exact definitions are in docs/statistics.md.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from statistics import NormalDist

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


#: Two-sided level and power at which `paired_mde` states the minimum detectable effect.
MDE_ALPHA = 0.05
MDE_POWER = 0.8


def mcnemar_exact(lost: int, gained: int) -> float:
    """McNemar's exact test of paired pass/fail verdicts: the two-sided p-value.

    `lost` and `gained` are the discordant pairs (b: passed before, failed now; c: the reverse).
    Under the null hypothesis each discordant pair goes either way with probability 1/2, so
    p = min(1, 2 P(X <= min(b, c))) with X ~ Binomial(b + c, 1/2); p = 1 without discordant pairs.
    Computed in integers (the tail's binomial coefficients over 2^(b+c)), so it is exact for any
    count, where a float sum of binomial terms underflows.
    """
    if lost < 0 or gained < 0:
        raise ValueError(f"counts must be >= 0, got lost={lost}, gained={gained}")
    n = lost + gained
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(lost, gained) + 1))
    return min(1.0, 2 * tail / 2**n)


def min_discordant(alpha: float = MDE_ALPHA) -> int:
    """The fewest discordant pairs with which McNemar's exact test can reach p <= alpha: all of
    them in one direction give p = 2 / 2^m, so m = ceil(log2(2 / alpha)) (6 at alpha 0.05)."""
    return math.ceil(math.log2(2.0 / alpha) - 1e-12)


def paired_mde(
    n_problems: int, n_discordant: int, *, alpha: float = MDE_ALPHA, power: float = MDE_POWER
) -> float:
    """Minimum detectable effect of a paired pass/fail comparison of `n_problems` problems:
    the smallest difference in solved share that McNemar's test finds with probability `power`
    at two-sided level `alpha`, given the share of discordant problems.

    Normal approximation of McNemar's test: the difference d = (gained - lost) / n has variance
    about p_disc / n, so d is detected when d >= (z_{1-alpha/2} + z_{power}) sqrt(p_disc / n)
    (2.80 sqrt(p_disc / n) at 0.05 and 0.8). p_disc is the observed discordant share; with none
    discordant, the planning value is the 95% upper bound of a share seen 0 times in n,
    3 / n (the rule of three). The exact test cannot reach `alpha` with fewer than
    `min_discordant(alpha)` discordant problems, so the result is never below that count over n;
    with fewer problems than that no difference is detectable: infinity. Capped at 1 otherwise;
    NaN without problems.
    """
    if n_problems <= 0:
        return math.nan
    if n_problems < min_discordant(alpha):
        return math.inf
    share = n_discordant / n_problems if n_discordant > 0 else min(1.0, 3.0 / n_problems)
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0) + NormalDist().inv_cdf(power)
    approx = z * math.sqrt(share / n_problems)
    return min(1.0, max(approx, min_discordant(alpha) / n_problems))


@dataclass(frozen=True)
class FlipResult:
    """Per comparison (one entry per column), McNemar's test on per-problem verdicts.

    `problems` are the codes of the rows of `gained`/`lost` (the sorted distinct problems of the
    input); a column whose values are not all 0/1 (`binary` False) has no flips, NaN p and MDE.
    """

    problems: np.ndarray
    gained: np.ndarray
    lost: np.ndarray
    binary: np.ndarray
    n_problems: np.ndarray
    p_value: np.ndarray
    mde: np.ndarray


def paired_flips(before: np.ndarray, after: np.ndarray, problem_codes: np.ndarray) -> FlipResult:
    """Which problems a checkpoint gained and lost against a reference, with McNemar's exact p.

    `before` and `after` are (n_rows, n_comparisons) 0/1 verdicts (NaN where a side has no
    sample); rows are (problem, seed, sample) keys, `problem_codes` their problems. Only rows both
    sides have count. A problem is solved on a side when more than half of its paired samples
    pass (strict majority; with one sample per problem, its verdict), so the unit of the test is
    the problem: samples of one problem are correlated, not the independent pairs McNemar's test
    assumes. Gained: unsolved before, solved after; lost: the reverse.
    """
    both = ~np.isnan(before) & ~np.isnan(after)
    n_cols = before.shape[1]
    zero_one = (before == 0.0) | (before == 1.0)
    binary = (~both | (zero_one & ((after == 0.0) | (after == 1.0)))).all(axis=0)
    problems = np.unique(problem_codes)
    # One grouping pass for both sides' solved shares and which problems have a pair at all.
    means = per_problem_means(
        np.hstack([np.where(both, before, np.nan), np.where(both, after, np.nan)]),
        problem_codes,
    )
    present = ~np.isnan(means[:, :n_cols])
    solved_before, solved_after = means[:, :n_cols] > 0.5, means[:, n_cols:] > 0.5
    gained = present & ~solved_before & solved_after & binary
    lost = present & solved_before & ~solved_after & binary
    n_problems = present.sum(axis=0)
    p_value = np.full(n_cols, np.nan)
    mde = np.full(n_cols, np.nan)
    for j in np.flatnonzero(binary & (n_problems > 0)):
        b, c = int(lost[:, j].sum()), int(gained[:, j].sum())
        p_value[j] = mcnemar_exact(b, c)
        mde[j] = paired_mde(int(n_problems[j]), b + c)
    return FlipResult(problems, gained, lost, binary, n_problems, p_value, mde)


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


#: How an interval was made (the tidy table's `ci_method`): Wilson's score interval at the
#: effective sample size, for scores in [0, 1]; the normal interval of a mean otherwise.
WILSON = "wilson"
NORMAL = "normal"


def wilson_interval(
    p: np.ndarray, n: np.ndarray, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's score interval of a share `p` seen in `n` (effective) draws, elementwise.

    Unlike p ± z·SE it stays inside [0, 1] and is not zero-width at p = 0 or 1 (its upper bound
    at p = 0 is z²/(n + z²)). `n` need not be an integer (an effective size). NaN where p or n is
    NaN or n <= 0.
    """
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = np.asarray(p, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        n = np.where(n > 0, n, np.nan)
        z2n = z * z / n
        centre = (p + z2n / 2.0) / (1.0 + z2n)
        half = z / (1.0 + z2n) * np.sqrt(np.maximum(p * (1.0 - p) / n + z2n / (4.0 * n), 0.0))
    low = np.where(p == 0.0, 0.0, np.clip(centre - half, 0.0, 1.0))  # exact ends, not rounding
    return low, np.where(p == 1.0, 1.0, np.clip(centre + half, 0.0, 1.0))


def effective_size(
    p: np.ndarray, stderr: np.ndarray, n_units: np.ndarray, n_max: np.ndarray
) -> np.ndarray:
    """How many independent draws a share `p` with (problem-clustered) standard error `stderr`
    is worth: p(1 - p) / stderr², i.e. n / design effect, at most `n_max` (the samples).

    Where that says nothing (p is 0 or 1, or stderr is 0 or unknown) it is `n_units`, the
    problems: samples of one problem may agree entirely, so the problem is the safe unit.
    """
    p, stderr = np.asarray(p, np.float64), np.asarray(stderr, np.float64)
    n_units, n_max = np.asarray(n_units, np.float64), np.asarray(n_max, np.float64)
    informative = (p > 0) & (p < 1) & (stderr > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        from_spread = np.where(informative, p * (1.0 - p) / stderr**2, n_units)
    return np.minimum(from_spread, np.maximum(n_max, n_units))


def score_interval(
    value: np.ndarray,
    stderr: np.ndarray,
    n_units: np.ndarray,
    n_max: np.ndarray,
    proportion: np.ndarray,
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each score's interval, elementwise: (low, high, n_eff).

    `stderr` must already be clustered by problem (`clustered_stderr`, or a per-problem
    estimator's). Where `proportion` (a score in [0, 1]) it is Wilson's at `effective_size`;
    elsewhere value ± z·stderr, and n_eff is `n_max`. NaN where the value or (for a mean) its
    stderr is unknown.
    """
    value = np.asarray(value, np.float64)
    stderr = np.asarray(stderr, np.float64)
    proportion = np.asarray(proportion, bool)
    n_eff = effective_size(value, stderr, n_units, n_max)
    w_low, w_high = wilson_interval(value, n_eff, confidence)
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    low = np.where(proportion, w_low, value - z * stderr)
    high = np.where(proportion, w_high, value + z * stderr)
    return low, high, np.where(proportion, n_eff, np.asarray(n_max, np.float64))


def design_effect(values: np.ndarray, problem_codes: np.ndarray) -> float:
    """How much the variance of a mean over samples grows because samples of one problem are
    alike: (problem-clustered variance) / (independent-samples variance), between 1 and the
    samples per problem (its largest possible value, when a problem's samples all agree).

    The clustered variance is the cluster-robust (CR1) one of the ratio estimator sum(y)/n:
    P/(P-1) · sum_i (y_i - mean·n_i)² / n², P problems with n_i samples summing to y_i. 1 with
    fewer than 2 problems or no spread (nothing to estimate a larger one from). NaN values are
    left out.
    """
    keep = ~np.isnan(values)
    values, codes = values[keep], problem_codes[keep]
    n = len(values)
    if n < 2:
        return 1.0
    _, inverse = np.unique(codes, return_inverse=True)
    sizes = np.bincount(inverse).astype(np.float64)
    if len(sizes) < 2 or len(sizes) == n:
        return 1.0
    mean = values.mean()
    naive = values.var(ddof=1) / n
    sums = np.bincount(inverse, weights=values)
    clustered = len(sizes) / (len(sizes) - 1) * np.sum((sums - mean * sizes) ** 2) / n**2
    if not naive > 0:
        return 1.0
    return float(min(max(1.0, clustered / naive), n / len(sizes)))


def paired_z_p(per_problem: np.ndarray) -> np.ndarray:
    """Two-sided p-value of "the mean per-problem difference is zero", per column: the normal
    test of the mean of the problems' differences (NaN where absent) with its standard error over
    problems, so several samples of one problem count once. NaN with fewer than 2 problems;
    with no spread, 1 for a zero mean and 0 otherwise (every problem moved the same way)."""
    present = ~np.isnan(per_problem)
    count = present.sum(axis=0)
    values = np.where(present, per_problem, 0.0)
    out = np.full(per_problem.shape[1], np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = values.sum(axis=0) / count
        var = (np.where(present, per_problem - mean, 0.0) ** 2).sum(axis=0) / (count - 1)
        z = np.abs(mean) / np.sqrt(var / count)
    normal = NormalDist()
    for j in np.flatnonzero(count >= 2):
        if var[j] > 0:
            out[j] = 2.0 * (1.0 - normal.cdf(float(z[j])))
        else:
            out[j] = 1.0 if mean[j] == 0 else 0.0
    return out


def drop_p_value(per_problem: np.ndarray, max_drop: float) -> float:
    """One-sided p-value of "the true change is at least -max_drop" from per-problem changes
    (one per problem, NaN-free): the normal test of their mean with its standard error over
    problems. Small when the data show a drop beyond `max_drop`. NaN with fewer than 2 problems
    (nothing to tell a drop from noise with); with no spread, 0 or 1 by the mean alone."""
    n = len(per_problem)
    if n < 2:
        return math.nan
    mean = float(per_problem.mean())
    stderr = float(per_problem.std(ddof=1)) / math.sqrt(n)
    if stderr > 0:
        return NormalDist().cdf((mean + max_drop) / stderr)
    return 0.0 if mean < -max_drop else 1.0


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: reject where adjusted <= alpha and the family-wise
    error rate (any false alarm among the comparisons) is at most alpha, whatever their
    dependence. NaN p-values are not comparisons: they stay NaN and do not count in the family."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    m = len(idx)
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    scaled = (m - np.arange(m)) * p[order]
    out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return out
