"""The statistics proven by simulation: synthetic checkpoints with known true scores.

Each test draws 2,000 checkpoints (vectorized numpy, a fixed seed, so it is deterministic) and
checks a rate against its promise with a tolerance of 2.5 points either way, wide enough that it
holds for the method, not for the seed: intervals cover the true score at 95% (also at true
scores of 0 and 1, and with several samples per problem, where the naive interval under-covers),
Holm's correction keeps the family-wise false-alarm rate at 5%, and the interval of the best of
30 checkpoints is not optimistic.
"""

from __future__ import annotations

import numpy as np
import pytest

from ckpteval.best import selection_interval
from ckpteval.stats import (
    design_effect,
    drop_p_value,
    holm,
    paired_z_p,
    score_interval,
    wilson_interval,
)

DRAWS = 2000
LEVEL = 0.95
TOLERANCE = 0.025


def _covered(low: np.ndarray, high: np.ndarray, truth: float) -> float:
    return float(np.mean((low <= truth) & (truth <= high)))


@pytest.mark.parametrize("truth", [0.05, 0.3, 0.5, 0.9])
def test_wilson_covers_at_its_rate_with_one_sample_per_problem(truth: float) -> None:
    rng = np.random.default_rng(1)
    n = 100
    passed = rng.random((DRAWS, n)) < truth
    value = passed.mean(axis=1)
    stderr = passed.std(axis=1, ddof=1) / np.sqrt(n)  # what a cell's json holds
    low, high, _ = score_interval(value, stderr, n, n, np.ones(DRAWS, bool))
    assert abs(_covered(low, high, truth) - LEVEL) <= TOLERANCE
    assert (low >= 0).all() and (high <= 1).all()


@pytest.mark.parametrize("truth", [0.0, 1.0])
def test_wilson_at_zero_and_one_is_not_zero_width_and_covers(truth: float) -> None:
    for n_problems, samples in ((4, 1), (50, 1), (50, 8)):
        value = np.full(DRAWS, truth)  # every sample of every draw scores the truth
        low, high, n_eff = score_interval(
            value, np.zeros(DRAWS), n_problems, n_problems * samples, np.ones(DRAWS, bool)
        )
        assert (high - low > 0).all() and _covered(low, high, truth) == 1.0
        # all samples agree: the problems are the unit, however many samples each has
        assert (n_eff == n_problems).all()
    # n = 4 (the per-source reward of 0.000 the issue saw): a trainer's 0.1 is inside
    low, high = wilson_interval(np.array([0.0]), np.array([4.0]))
    assert low[0] == 0.0 and high[0] > 0.4


def _clustered_draws(
    rng: np.random.Generator, n_problems: int, samples: int, mean: float, icc: float
) -> np.ndarray:
    """(DRAWS, problems, samples) pass/fail: each problem's rate ~ Beta with the given mean and
    intra-problem correlation, its samples Bernoulli at that rate."""
    total = 1 / icc - 1
    rates = rng.beta(mean * total, (1 - mean) * total, size=(DRAWS, n_problems, 1))
    return (rng.random((DRAWS, n_problems, samples)) < rates).astype(np.float64)


def test_several_samples_per_problem_naive_under_covers_clustered_does_not() -> None:
    rng = np.random.default_rng(2)
    n_problems, samples, truth = 60, 8, 0.4
    draws = _clustered_draws(rng, n_problems, samples, truth, icc=0.5)
    flat = draws.reshape(DRAWS, -1)
    n = n_problems * samples
    value = flat.mean(axis=1)
    proportion = np.ones(DRAWS, bool)
    # naive: samples as independent (the cell's per-sample stderr, Wilson at n samples)
    naive_se = flat.std(axis=1, ddof=1) / np.sqrt(n)
    low, high, _ = score_interval(value, naive_se, n, n, proportion)
    assert _covered(low, high, truth) < 0.85
    # pass@1: the stderr over problems (what pass@k's cells hold), Wilson at the effective n
    per_problem_se = draws.mean(axis=2).std(axis=1, ddof=1) / np.sqrt(n_problems)
    low, high, n_eff = score_interval(value, per_problem_se, n_problems, n, proportion)
    assert abs(_covered(low, high, truth) - LEVEL) <= TOLERANCE
    assert np.median(n_eff) < n / 3  # the design effect is 1 + 7 * 0.5 = 4.5
    # a mean over samples: its naive stderr inflated by the design effect the aggregate
    # estimates from the per-sample scores (as `aggregate.tables.score_intervals` does)
    codes = np.repeat(np.arange(n_problems), samples)
    deff = np.array([design_effect(row, codes) for row in flat])
    low, high, _ = score_interval(value, naive_se * np.sqrt(deff), n_problems, n / deff, proportion)
    assert abs(_covered(low, high, truth) - LEVEL) <= TOLERANCE


def test_mean_interval_of_unbounded_rewards_clustered_by_problem_covers() -> None:
    rng = np.random.default_rng(3)
    n_problems, samples, truth = 80, 4, 2.5
    problem_effect = rng.normal(0.0, 3.0, size=(DRAWS, n_problems, 1))
    rewards = truth + problem_effect + rng.normal(0.0, 1.0, size=(DRAWS, n_problems, samples))
    value = rewards.reshape(DRAWS, -1).mean(axis=1)
    clustered = rewards.mean(axis=2).std(axis=1, ddof=1) / np.sqrt(n_problems)
    low, high, _ = score_interval(
        value, clustered, n_problems, n_problems * samples, np.zeros(DRAWS, bool)
    )
    assert abs(_covered(low, high, truth) - LEVEL) <= TOLERANCE


def test_holm_keeps_the_family_wise_false_alarm_rate() -> None:
    """20 comparisons per draw (checkpoints x tasks), 15 with no true change and 5 with a real
    one; a false alarm is a true-null comparison marked. Uncorrected marks raise one in about
    half the draws; Holm's keep it at or below 5%."""
    rng = np.random.default_rng(4)
    n_problems, comparisons, real = 100, 20, 5
    rates = rng.uniform(0.2, 0.8, size=(1, n_problems, comparisons))
    shift = np.zeros(comparisons)
    shift[:real] = 0.3
    before = rng.random((DRAWS, n_problems, comparisons)) < rates
    after = rng.random((DRAWS, n_problems, comparisons)) < np.clip(rates + shift, 0, 1)
    diffs = (after.astype(np.float64) - before).transpose(1, 0, 2).reshape(n_problems, -1)
    p = paired_z_p(diffs).reshape(DRAWS, comparisons)
    null = np.arange(comparisons) >= real
    adjusted = np.vstack([holm(row) for row in p])
    false_alarm_raw = np.mean((p[:, null] <= 0.05).any(axis=1))
    false_alarm_holm = np.mean((adjusted[:, null] <= 0.05).any(axis=1))
    assert false_alarm_raw > 0.4
    assert false_alarm_holm <= 0.05 + TOLERANCE
    assert np.mean(adjusted[:, ~null] <= 0.05) > 0.8  # and the real changes are still found


def test_the_interval_of_the_best_of_30_is_not_optimistic() -> None:
    """30 checkpoints of equal true score 0.5 (problems of Beta(2, 2) difficulty, the same for
    all): the highest observed score is biased upward, so the winner's own interval covers the
    truth in about 64% of draws; the selection-aware one at least at its stated 95%. 1,000
    draws of 200 resamples (a bootstrap per draw is the cost; about 3 s)."""
    rng = np.random.default_rng(5)
    draws, n_problems, n_ckpts = 1000, 100, 30
    covered = naive = 0
    for _ in range(draws):
        rates = rng.beta(2, 2, size=(n_problems, 1))
        scores = (rng.random((n_problems, n_ckpts)) < rates).astype(np.float64)
        _, _, (low, high), (naive_low, naive_high), wins = selection_interval(
            [scores], [1.0], n_boot=200, rng=rng
        )
        covered += low <= 0.5 <= high
        naive += naive_low <= 0.5 <= naive_high
        assert wins.sum() == pytest.approx(1.0)
    assert covered / draws >= LEVEL - TOLERANCE
    assert naive / draws < 0.8


def test_the_gate_fails_a_checkpoint_within_its_allowance_at_most_alpha_of_the_time() -> None:
    """5 tasks of 200 problems, each truly 2 points worse (exactly the allowance): the gate's
    test (`drop_p_value`, Holm over the tasks) fails the checkpoint in at most 5% of draws; a
    true drop of 12 points, 10 beyond the allowance, fails it in most."""
    rng = np.random.default_rng(6)
    n_problems, tasks, allowed = 200, 5, 0.02
    rates = rng.uniform(0.2, 0.8, size=(n_problems, tasks))

    def failed(true_drop: float) -> float:
        before = rng.random((DRAWS, n_problems, tasks)) < rates
        after = rng.random((DRAWS, n_problems, tasks)) < rates - true_drop
        changes = after.astype(np.float64) - before
        p = np.array(
            [[drop_p_value(changes[d, :, t], allowed) for t in range(tasks)] for d in range(DRAWS)]
        )
        return float(np.mean([(holm(row) <= 0.05).any() for row in p]))

    assert failed(allowed) <= 0.05 + TOLERANCE
    assert failed(0.12) > 0.8
