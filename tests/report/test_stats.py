"""Seed statistics of the report against scipy: t intervals, paired tests, Holm."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stability.stats.paired import (
    holm,
    mean_ci,
    min_detectable,
    paired,
    paired_power,
    seeds_needed,
    wilcoxon_min_p,
)


def test_mean_ci_is_the_t_interval():
    x = [0.41, 0.45, 0.39, 0.44, 0.40]
    ci = mean_ci(x, 0.95)
    low, high = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert ci.n == 5
    assert ci.mean == pytest.approx(np.mean(x))
    assert ci.std == pytest.approx(np.std(x, ddof=1))
    assert (ci.low, ci.high) == pytest.approx((low, high))
    wider = mean_ci(x, 0.99)
    assert wider.low < ci.low and wider.high > ci.high


def test_mean_ci_with_a_diverged_seed_is_infinite_without_a_spread():
    ci = mean_ci([0.3, 0.31, math.inf])
    assert ci.mean == math.inf
    assert math.isnan(ci.std) and math.isnan(ci.low) and math.isnan(ci.high)


def test_mean_ci_of_one_seed_has_no_interval():
    ci = mean_ci([0.5])
    assert ci.mean == 0.5 and math.isnan(ci.low)
    assert mean_ci([]).n == 0


def test_paired_matches_scipy_ttest_rel_and_wilcoxon():
    ref = {0: 0.40, 1: 0.42, 2: 0.41, 3: 0.43, 4: 0.39}
    other = {0: 0.45, 1: 0.44, 2: 0.47, 3: 0.44, 4: 0.46}
    r = paired(ref, other)
    a, b = [ref[s] for s in sorted(ref)], [other[s] for s in sorted(ref)]
    d = np.subtract(b, a)
    assert r.n == 5 and r.seeds == (0, 1, 2, 3, 4)
    assert r.mean_diff == pytest.approx(d.mean())
    assert r.p_t == pytest.approx(stats.ttest_rel(b, a).pvalue)
    assert r.p_wilcoxon == pytest.approx(stats.wilcoxon(d).pvalue)
    low, high = stats.t.interval(0.95, 4, loc=d.mean(), scale=stats.sem(d))
    assert (r.low, r.high) == pytest.approx((low, high))


def test_paired_uses_only_seeds_both_finished():
    ref = {0: 0.4, 1: 0.5, 2: 0.45, 3: 0.41}
    other = {0: 0.5, 1: math.inf, 2: 0.52, 4: 0.3}  # seed 1 diverged, seeds 3/4 unpaired
    r = paired(ref, other)
    assert r.seeds == (0, 2)
    assert r.mean_diff == pytest.approx(((0.5 - 0.4) + (0.52 - 0.45)) / 2)


def test_paired_edge_cases():
    assert math.isnan(paired({0: 0.4}, {0: 0.5}).p_t)  # one pair: no test
    same = paired({0: 0.4, 1: 0.5}, {0: 0.4, 1: 0.5})
    assert (same.mean_diff, same.p_t, same.p_wilcoxon) == (0.0, 1.0, 1.0)
    shifted = paired({0: 0.4, 1: 0.5, 2: 0.6}, {0: 0.5, 1: 0.6, 2: 0.7})
    assert shifted.p_t == pytest.approx(0.0, abs=1e-12)  # every seed moved by exactly +0.1


def test_wilcoxon_floor_with_five_seeds_is_0_0625():
    assert wilcoxon_min_p(5) == 0.0625
    # The strongest possible 5-seed result really cannot go lower.
    assert stats.wilcoxon([0.1, 0.2, 0.3, 0.4, 0.5]).pvalue == pytest.approx(wilcoxon_min_p(5))


def test_holm_adjustment():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    adjusted = holm([0.5, math.nan, 0.01])
    assert adjusted[0] == pytest.approx(0.5) and math.isnan(adjusted[1])
    assert adjusted[2] == pytest.approx(0.02)
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # 2 x 0.8 capped at 1, then monotone


@pytest.mark.parametrize(("n", "alpha", "power"), [(3, 0.05, 0.8), (5, 0.05, 0.8),
                                                   (10, 0.05, 0.8), (5, 0.01, 0.9)])
def test_min_detectable_difference_matches_statsmodels(n, alpha, power):
    from statsmodels.stats.power import TTestPower

    sd = 0.013
    expected = TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power,
                                        alternative="two-sided") * sd
    assert min_detectable(sd, n, alpha, power) == pytest.approx(expected, rel=1e-6)
    assert paired_power(expected, sd, n, alpha) == pytest.approx(power, abs=1e-6)


def test_seeds_needed_is_the_smallest_n_with_the_power():
    from statsmodels.stats.power import TTestPower

    sd, effect = 0.02, 0.01  # half an SD
    n = seeds_needed(effect, sd, 0.05, 0.8)
    exact = TTestPower().solve_power(effect_size=effect / sd, nobs=None, alpha=0.05, power=0.8)
    assert n == math.ceil(exact)
    assert paired_power(effect, sd, int(n), 0.05) >= 0.8 > paired_power(effect, sd, int(n) - 1)
    assert seeds_needed(100 * sd, sd) == 2  # a huge effect needs the minimum of two pairs
    assert seeds_needed(1e-4 * sd, sd) == math.inf  # beyond 10000 seeds


def test_power_is_undefined_without_spread_or_pairs():
    assert math.isnan(min_detectable(0.0, 5))
    assert math.isnan(min_detectable(0.01, 1))
    assert math.isnan(seeds_needed(0.01, 0.0))


def test_paired_reports_the_sd_of_the_differences():
    ref = {0: 0.40, 1: 0.41, 2: 0.43}
    other = {0: 0.42, 1: 0.42, 2: 0.47}
    assert paired(ref, other).sd == pytest.approx(np.std([0.02, 0.01, 0.04], ddof=1))
