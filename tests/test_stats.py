"""Statistics against hand-computed values: pass@k curves, stderr, paired bootstrap intervals,
McNemar's exact test, the minimum detectable effect, per-problem flips."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ckpteval.metrics import mean_and_stderr, pass_at_k, pass_at_k_table
from ckpteval.stats import (
    bootstrap_weights,
    conservative_stderr,
    design_effect,
    holm,
    mcnemar_exact,
    min_discordant,
    paired_bootstrap,
    paired_flips,
    paired_mde,
    pass_at_k_curve,
    per_problem_means,
    wilson_interval,
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


# McNemar's exact test, minimum detectable effect, flips ------------------------------------------


@pytest.mark.parametrize(
    ("lost", "gained", "expected"),
    [
        (0, 5, 0.0625),  # 2 * 1/32
        (5, 0, 0.0625),  # symmetric
        (1, 9, 2 * 11 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
        (2, 10, 2 * (1 + 12 + 66) / 4096),
        (0, 6, 2 / 64),  # the fewest discordant pairs that reach p < 0.05
        (4, 4, 1.0),  # b = c
        (3, 4, 1.0),  # 2 * P(X <= 3), X ~ Bin(7, 1/2), = 1 exactly
        (0, 0, 1.0),  # nothing discordant
        (0, 1, 1.0),
    ],
)
def test_mcnemar_exact_hand_computed_tails(lost: int, gained: int, expected: float) -> None:
    assert mcnemar_exact(lost, gained) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_exact_equals_scipy_binomtest() -> None:
    stats = pytest.importorskip("scipy.stats")
    pairs = [(b, c) for b in range(0, 25, 3) for c in range(0, 25, 4) if b + c] + [
        (130, 170),
        (480, 520),
        (3, 900),
    ]
    for b, c in pairs:
        expected = stats.binomtest(min(b, c), b + c, 0.5).pvalue
        assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300), (b, c)


def test_mcnemar_exact_stays_exact_where_floats_underflow() -> None:
    # 2 * 2^-1100 is below the smallest double: the integer tail gives 0.0, never an error or NaN.
    assert mcnemar_exact(0, 1100) == 0.0
    assert mcnemar_exact(550, 550) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


def test_min_discordant_is_where_the_exact_test_can_first_reject() -> None:
    assert min_discordant(0.05) == 6 and min_discordant(0.01) == 8
    assert mcnemar_exact(0, 5) > 0.05 >= mcnemar_exact(0, 6)
    assert mcnemar_exact(0, 7) > 0.01 >= mcnemar_exact(0, 8)


def test_paired_mde_formula_values() -> None:
    z = 1.959963984540054 + 0.8416212335729143  # z_.975 + z_.8
    # n = 100, 20 discordant: 2.8016 * sqrt(0.2 / 100) = 0.1253, above the floor 6/100.
    assert paired_mde(100, 20) == pytest.approx(z * math.sqrt(0.2 / 100))
    assert paired_mde(100, 20) == pytest.approx(0.12529, abs=1e-5)
    # n = 500, 100 discordant: 0.0560.
    assert paired_mde(500, 100) == pytest.approx(z * math.sqrt(0.2 / 500))
    # n = 20, 4 discordant: the formula says 0.280, but the exact test needs 6 flips: 6/20.
    assert z * math.sqrt(0.2 / 20) == pytest.approx(0.2802, abs=1e-4)
    assert paired_mde(20, 4) == pytest.approx(0.3)
    # Nothing discordant: planning share 3/n (rule of three); at n = 1000 the floor 6/n decides.
    assert paired_mde(1000, 0) == pytest.approx(max(z * math.sqrt(3 / 1000 / 1000), 0.006))
    assert paired_mde(1000, 0) == pytest.approx(0.006)
    # Capped at 1; fewer problems than the exact test needs: nothing detectable (infinite);
    # nothing to compare is NaN; other levels follow the normal quantiles.
    assert paired_mde(6, 6) == 1.0
    assert paired_mde(5, 5) == math.inf and paired_mde(7, 0, alpha=0.01) == math.inf
    assert math.isnan(paired_mde(0, 0))
    assert paired_mde(1000, 300, alpha=0.01, power=0.9) == pytest.approx(
        (2.5758293035489 + 1.2815515655446004) * math.sqrt(0.3 / 1000)
    )


def test_paired_flips_majority_per_problem_over_shared_samples() -> None:
    nan = np.nan
    # rows: (problem, sample); two comparisons (columns)
    problems = np.array([0, 0, 0, 1, 1, 2, 3])
    before = np.array([[1, 1], [1, 1], [0, 0], [0, 1], [0, 1], [1, 0], [0, 0]], dtype=np.float64)
    after = np.array(
        [[0, 1], [0, 1], [nan, 0], [1, 0], [1, nan], [1, 0], [nan, 1]], dtype=np.float64
    )
    result = paired_flips(before, after, problems)
    assert result.problems.tolist() == [0, 1, 2, 3]
    # column 0: problem 0 pairs two samples (2/2 -> 0/2: lost), problem 1 (0/2 -> 2/2: gained),
    # problem 2 unchanged, problem 3 has no shared sample (left out).
    assert result.lost[:, 0].tolist() == [True, False, False, False]
    assert result.gained[:, 0].tolist() == [False, True, False, False]
    assert result.n_problems[0] == 3
    assert result.p_value[0] == pytest.approx(mcnemar_exact(1, 1))
    assert result.mde[0] == math.inf  # 3 problems: the exact test cannot reach 0.05
    # column 1: problem 0 3 pairs (2/3 -> 2/3), problem 1 one pair (1 -> 0: lost), problem 3 gained
    assert result.lost[:, 1].tolist() == [False, True, False, False]
    assert result.gained[:, 1].tolist() == [False, False, False, True]
    assert result.n_problems[1] == 4
    assert result.binary.tolist() == [True, True]


def test_paired_flips_half_passing_is_unsolved_and_scores_need_0_or_1() -> None:
    problems = np.array([0, 0])
    result = paired_flips(np.array([[1.0], [0.0]]), np.array([[1.0], [1.0]]), problems)
    assert result.gained[:, 0].tolist() == [True]  # 1/2 is not a majority; 2/2 is
    scores = paired_flips(np.array([[0.5], [0.0]]), np.array([[1.0], [1.0]]), problems)
    assert scores.binary.tolist() == [False]
    assert not scores.gained.any() and math.isnan(scores.p_value[0])
    empty = paired_flips(np.empty((0, 1)), np.empty((0, 1)), np.empty(0, dtype=np.int64))
    assert empty.n_problems.tolist() == [0] and math.isnan(empty.p_value[0])


def test_a_mean_of_values_past_the_float_range_has_an_infinite_stderr_not_an_error() -> None:
    """Squares of 1e308 overflow (Python's `**` raises OverflowError): the cell's statistics
    report a spread beyond measure instead of stopping the run."""
    from ckpteval.metrics import mean_and_stderr

    mean, stderr = mean_and_stderr([1e308, -1e308, 1e308])
    assert math.isfinite(mean) and stderr == math.inf
    assert mean_and_stderr([1.0, 3.0]) == (2.0, 1.0)


# intervals and Holm ------------------------------------------------------------------------------


def test_wilson_interval_matches_hand_values() -> None:
    low, high = wilson_interval(np.array([0.0, 0.5, 1.0, np.nan]), np.array([4, 10, 4, 10]))
    z2 = 1.959963984540054**2
    assert (low[0], high[0]) == pytest.approx((0.0, z2 / (4 + z2)))  # 0.490, not zero-width
    assert (low[1], high[1]) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # Wilson (1927)
    assert (low[2], high[2]) == pytest.approx((4 / (4 + z2), 1.0))
    assert math.isnan(low[3]) and math.isnan(high[3])


def test_design_effect_is_one_for_independent_samples_and_bounded_by_the_cluster_size() -> None:
    codes = np.repeat(np.arange(10), 4)
    alike = np.repeat([0.0, 1.0] * 5, 4)  # each problem's 4 samples agree
    assert design_effect(alike, codes) == pytest.approx(4.0)
    alternating = np.tile([0.0, 1.0], 20)  # every problem half solved: no problem effect
    assert design_effect(alternating, codes) == 1.0
    assert design_effect(alike, np.arange(40)) == 1.0  # one sample per problem


def test_holm_adjusts_step_down_and_skips_nan() -> None:
    adjusted = holm(np.array([0.01, 0.04, np.nan, 0.03]))
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1, made monotone: 0.03, 0.06, 0.06
    assert adjusted[[0, 1, 3]] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(adjusted[2])
    assert holm(np.array([0.5, 0.9])) == pytest.approx([1.0, 1.0])


def test_wilson_interval_equals_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    cases = [(k, n) for n in (1, 4, 10, 37, 120, 1000) for k in sorted({0, 1, n // 3, n - 1, n})]
    low, high = wilson_interval(
        np.array([k / n for k, n in cases]), np.array([n for _, n in cases], dtype=np.float64)
    )
    for (k, n), lo, hi in zip(cases, low, high):
        expected = stats.binomtest(k, n).proportion_ci(method="wilson")
        assert (lo, hi) == pytest.approx((expected.low, expected.high), abs=1e-12), (k, n)
