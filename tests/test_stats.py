"""Statistics against hand-computed values: pass@k curves, stderr, paired bootstrap intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ckpteval.metrics import mean_and_stderr, pass_at_k, pass_at_k_table
from ckpteval.stats import (
    bootstrap_weights,
    conservative_stderr,
    paired_bootstrap,
    pass_at_k_curve,
    per_problem_means,
)

# pass@k ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 0, 1, 0.0),  # nothing passes
        (5, 5, 5, 1.0),  # everything passes
        (5, 1, 1, 0.2),  # pass@1 is c/n
        (5, 1, 2, 1 - 6 / 10),  # 1 - C(4,2)/C(5,2)
        (5, 4, 2, 1.0),  # n - c < k: every draw of 2 contains a pass
        (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_curve_matches_hand_values(n: int, c: int, k: int, expected: float) -> None:
    mean, stderr = pass_at_k_curve(np.array([n]), np.array([c]), np.array([k]))
    assert mean[0] == pytest.approx(expected)
    assert stderr[0] == 0.0  # one problem: no spread
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_curve_mean_and_stderr_over_problems() -> None:
    # Two problems with pass@1 = 0 and 1: mean 0.5, sample std 0.7071, stderr 0.7071/sqrt(2) = 0.5.
    mean, stderr = pass_at_k_curve(np.array([4, 4]), np.array([0, 4]), np.array([1]))
    assert mean[0] == pytest.approx(0.5)
    assert stderr[0] == pytest.approx(0.5)
    assert mean_and_stderr([0.0, 1.0]) == pytest.approx((0.5, 0.5))


def test_pass_at_k_curve_equals_the_metrics_module_table() -> None:
    rng = np.random.default_rng(3)
    n = rng.integers(6, 12, size=40)
    c = rng.integers(0, 7, size=40).clip(max=n)
    ks = np.arange(1, n.min() + 1)
    mean, stderr = pass_at_k_curve(n, c, ks)
    table = pass_at_k_table(zip(n.tolist(), c.tolist()), ks.tolist())
    for i, k in enumerate(ks):
        assert mean[i] == pytest.approx(table[int(k)][0])
        assert stderr[i] == pytest.approx(table[int(k)][1])


def test_pass_at_k_curve_rejects_k_above_smallest_n() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_k_curve(np.array([3, 5]), np.array([1, 1]), np.array([4]))


# stderr ------------------------------------------------------------------------------------------


def test_conservative_stderr_is_root_mean_square() -> None:
    assert conservative_stderr(np.array([0.03, 0.04])) == pytest.approx(math.sqrt(0.00125))
    assert conservative_stderr(np.array([0.02, np.nan])) == pytest.approx(0.02)
    assert math.isnan(conservative_stderr(np.array([np.nan])))


# per-problem means -------------------------------------------------------------------------------


def test_per_problem_means_ignores_nan_and_unsorted_rows() -> None:
    values = np.array([[1.0, np.nan], [0.0, 1.0], [1.0, 1.0], [np.nan, np.nan]])
    problems = np.array([1, 0, 1, 0])
    means = per_problem_means(values, problems)
    np.testing.assert_allclose(means, [[0.0, 1.0], [1.0, 1.0]])


# bootstrap ---------------------------------------------------------------------------------------


def test_bootstrap_weights_are_resample_counts() -> None:
    weights = bootstrap_weights(7, 500, np.random.default_rng(0))
    assert weights.shape == (500, 7)
    assert (weights.sum(axis=1) == 7).all()
    # Each item is drawn 7 * 1/7 = 1 time per resample on average.
    assert weights.mean() == pytest.approx(1.0, abs=0.05)


def test_paired_bootstrap_hand_computed_interval() -> None:
    # Per-problem differences [0, 0, 1, 0]: mean 0.25. A resample mean is X/4 with X ~ Bin(4, 1/4):
    # P(X=0) = 0.316 > 2.5%, so the lower bound is 0; P(X>=3) = 5.1% and P(X=4) = 0.4%, so the
    # upper bound is 0.75.
    diffs = np.array([[0.0], [0.0], [1.0], [0.0]])
    result = paired_bootstrap(diffs, n_boot=2000, rng=np.random.default_rng(1))
    assert result.estimate[0] == pytest.approx(0.25)
    assert result.low[0] == 0.0
    assert result.high[0] == 0.75
    assert result.n_problems[0] == 4


def test_paired_bootstrap_degenerate_columns() -> None:
    diffs = np.array([[0.5, np.nan, 2.0], [0.5, np.nan, np.nan], [0.5, np.nan, np.nan]])
    result = paired_bootstrap(diffs, n_boot=200, rng=np.random.default_rng(2))
    # Constant differences: a zero-width interval at the value.
    assert (result.estimate[0], result.low[0], result.high[0]) == (0.5, 0.5, 0.5)
    # No shared problem: nothing to say.
    assert np.isnan([result.estimate[1], result.low[1], result.high[1]]).all()
    # One shared problem: its value, zero width.
    assert (result.estimate[2], result.low[2], result.high[2]) == (2.0, 2.0, 2.0)
    assert list(result.n_problems) == [3, 0, 1]


def test_paired_bootstrap_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        paired_bootstrap(np.zeros(3), n_boot=10, rng=np.random.default_rng(0))
    with pytest.raises(ValueError):
        paired_bootstrap(np.zeros((3, 1)), n_boot=0, rng=np.random.default_rng(0))


def _simulate(
    rng: np.random.Generator,
    datasets: int,
    problems: int,
    samples: int,
    true_delta: float,
    paired: bool,
) -> np.ndarray:
    """Per-problem mean differences (problems x datasets) of binary verdicts of two checkpoints
    whose pass probability on each problem differs by exactly `true_delta`."""
    p_a = rng.uniform(0.2, 0.7, size=(datasets, problems, 1))
    u_a = rng.uniform(size=(datasets, problems, samples))
    u_b = u_a if paired else rng.uniform(size=(datasets, problems, samples))
    a = (u_a < p_a).astype(float)
    b = (u_b < p_a + true_delta).astype(float)
    return (b - a).mean(axis=2).T


def test_paired_bootstrap_covers_the_true_difference_95_percent_of_the_time() -> None:
    # 200 simulated datasets of 200 problems x 4 samples with a known difference of 0.1.
    diffs = _simulate(np.random.default_rng(7), 200, 200, 4, 0.1, paired=True)
    result = paired_bootstrap(diffs, n_boot=1000, rng=np.random.default_rng(8))
    covered = (result.low <= 0.1) & (result.high >= 0.1)
    # Binomial(200, 0.95) lies in [0.905, 0.99] with probability > 99.5%.
    assert 0.905 <= covered.mean() <= 0.99
    assert (result.low > 0).mean() > 0.95  # and the difference is detected almost always


def test_paired_bootstrap_coverage_without_a_difference() -> None:
    diffs = _simulate(np.random.default_rng(9), 200, 150, 3, 0.0, paired=False)
    result = paired_bootstrap(diffs, n_boot=1000, rng=np.random.default_rng(10))
    false_alarms = ((result.low > 0) | (result.high < 0)).mean()
    assert false_alarms <= 0.095


def test_pairing_narrows_the_interval() -> None:
    rng = np.random.default_rng(11)
    paired = paired_bootstrap(
        _simulate(rng, 50, 200, 4, 0.1, paired=True), n_boot=500, rng=np.random.default_rng(12)
    )
    unpaired = paired_bootstrap(
        _simulate(rng, 50, 200, 4, 0.1, paired=False), n_boot=500, rng=np.random.default_rng(12)
    )
    assert (paired.high - paired.low).mean() < 0.7 * (unpaired.high - unpaired.low).mean()
