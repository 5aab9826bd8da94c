"""Multiple comparisons with the best (``stats.best``) and the shown interval, against reference
values: Student t quantiles from the published table (e.g. NIST/SEMATECH e-Handbook, table
1.3.6.7.2: t(0.975, 4) = 2.776, t(0.9875, 4) = 3.495) and an independent loop implementation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stability.stats import best as mcb
from stability.stats import effects as fx

T_975_4 = 2.776  # one-sided 0.025 (= 0.05 over k - 1 = 2 comparisons), 4 df, published table
T_9875_4 = 3.495  # what a two-sided (conservative) quantile would use instead
T_95_4 = 2.132  # one-sided 0.05, 4 df: one comparison at the factor's whole alpha

# Three levels, one cell, five seeds: y[level, cell, seed]. TIGHT: level 1 is 0.003 above
# level 0 with little seed noise, level 2 0.011; LOOSE: the same means, five times the noise.
BASE = np.array([0.100, 0.104, 0.098, 0.103, 0.101])
E1 = np.array([0.002, -0.002, 0.0015, -0.0015, 0.0])
E2 = np.array([-0.0015, 0.002, 0.0, 0.0015, -0.002])
TIGHT = np.stack([BASE, BASE + 0.003 + E1, BASE + 0.011 + E2 / 4])[:, None, :]
LOOSE = np.stack([BASE, BASE + 0.003 + 5 * E1, BASE + 0.011 + 5 * E2])[:, None, :]
Y = LOOSE
# Nothing shown within 0.005, but levels 0 and 1 (0.0002 apart) are within it of every other
# level one comparison at a time; level 2 is shown worse.
NEARY = np.stack([BASE, BASE + 0.0002 + 2.6 * E1, BASE + 0.011 + 2.6 * E2 / 4])[:, None, :]


def _by_hand(y: np.ndarray, t: float) -> tuple[list[float], list[float]]:
    """U_i = max(0, max_j mean(d_ij) + t se_ij) and L_i = max_j mean(d_ij) - t se_ij, in loops."""
    k, upper, lower = y.shape[0], [], []
    for i in range(k):
        hi, lo = [], []
        for j in range(k):
            if i == j:
                continue
            d = y[i, 0] - y[j, 0]
            se = d.std(ddof=1) / math.sqrt(len(d))
            hi.append(d.mean() + t * se)
            lo.append(d.mean() - t * se)
        upper.append(max(0.0, max(hi)))
        lower.append(max(lo))
    return upper, lower


@pytest.mark.parametrize("y", [TIGHT, LOOSE], ids=["tight", "loose"])
def test_mcb_bounds_match_the_published_one_sided_quantile(y):
    b = mcb.mcb(mcb.pairwise(y), delta=0.005, alpha=0.05)
    upper, lower = _by_hand(y, T_975_4)
    assert b.upper == pytest.approx(upper, abs=2e-5)
    assert b.lower == pytest.approx(lower, abs=2e-5)
    conservative, _ = _by_hand(y, T_9875_4)
    assert not np.allclose(b.upper, conservative, atol=2e-5)
    assert float(b.alpha_each) == pytest.approx(0.025)


def test_shown_worse_means_worse_by_more_than_the_margin_not_merely_worse():
    """Level 1 is shown worse than level 0 (its lower bound is above 0) but not by more than
    the margin: it is not worse (within the margin one comparison at a time: near). Level 2's
    lower bound clears the margin."""
    b = mcb.mcb(mcb.pairwise(TIGHT), delta=0.005, alpha=0.05)
    assert 0 < b.lower[1] < 0.005 and b.status[1] == mcb.NEAR
    assert b.lower[2] > 0.005 and b.status[2] == mcb.WORSE
    assert b.status[0] == mcb.WITHIN


def test_the_point_gap_is_what_the_upper_bound_bounds():
    b = mcb.mcb(mcb.pairwise(Y), delta=0.005, alpha=0.05)
    means = Y[:, 0].mean(axis=-1)
    assert b.gap == pytest.approx(means - means.min(), abs=1e-12)
    assert (b.upper >= b.gap).all()


def test_the_fallback_takes_the_lowest_estimate_when_nothing_is_shown_within():
    """Nothing within: the level with the lowest point estimate (gap 0), not the simpler or
    cheaper level whose estimate is also within the margin (level 1, 0.003 above)."""
    b = mcb.mcb(mcb.pairwise(Y), delta=0.005, alpha=0.05)
    assert not (b.status == mcb.WITHIN).any()
    pool = mcb.candidates(b.status, b.gap, 0.005)
    assert pool.tolist() == [True, False, False]  # gaps 0, 0.003, 0.011
    assert mcb.basis(b.status, b.gap, 0.005) == mcb.LOWEST_BASIS
    assert mcb.choose(pool, pool, np.array([1, 0, 0]), b.gap) == 0  # simplicity: ties only
    within = mcb.mcb(mcb.pairwise(TIGHT), delta=0.005, alpha=0.05)
    assert mcb.candidates(within.status, within.gap, 0.005).tolist() == [True, False, False]
    assert mcb.basis(within.status, within.gap, 0.005) == mcb.WITHIN_BASIS


def test_near_is_within_the_margin_one_comparison_at_a_time_and_the_choice_takes_it():
    """``single`` is U_i with the one-sided quantile at the factor's whole alpha (published
    t(0.95, 4) = 2.132), not split over the k - 1 comparisons; a level whose ``single`` is
    within the margin but whose ``upper`` is not is ``near``. With nothing within, the near
    levels are the candidates, and the simpler of them is taken though its estimate is not
    the lowest; the level shown worse never is."""
    b = mcb.mcb(mcb.pairwise(NEARY), delta=0.005, alpha=0.05)
    single, _ = _by_hand(NEARY, T_95_4)
    assert b.single == pytest.approx(single, abs=2e-5)
    assert b.status.tolist() == [mcb.NEAR, mcb.NEAR, mcb.WORSE]
    assert (b.upper[:2] > 0.005).all() and (b.single[:2] <= 0.005).all()
    pool = mcb.candidates(b.status, b.gap, 0.005)
    assert pool.tolist() == [True, True, False]
    assert mcb.basis(b.status, b.gap, 0.005) == mcb.NEAR_BASIS
    assert b.gap[1] > b.gap[0] and mcb.choose(pool, pool, np.array([1, 0, 0]), b.gap) == 1
    assert mcb.choose(pool, np.array([True, False, False]), np.array([1, 0, 0]), b.gap) == 0


def test_a_level_never_run_is_no_comparison():
    """A grid that is not fully crossed is decided as one group of joint levels, most of them
    never run: they are absent, and the levels that ran get the bounds of their own comparisons
    (before, every bound was infinite as soon as one level had no runs)."""
    absent = np.concatenate([LOOSE, np.full((1, 1, 5), np.nan)])
    b = mcb.mcb(mcb.pairwise(absent), delta=0.005, alpha=0.05)
    ran = mcb.mcb(mcb.pairwise(LOOSE), delta=0.005, alpha=0.05)
    assert b.status[3] == mcb.ABSENT and np.isfinite(b.upper[:3]).all()
    assert b.upper[:3] == pytest.approx(ran.upper) and b.single[:3] == pytest.approx(ran.single)
    assert b.status[:3].tolist() == ran.status.tolist()


CHI2_20_4 = 1.649  # lower 20% point of chi-square, 4 df (published table, e.g. NIST 1.3.6.7.4)


def test_seeds_to_within_sizes_each_pair_for_power_with_the_sds_upper_confidence_limit():
    """The first count at which the binding pair clears the margin with 80% power: the t
    quantiles of the bound (1 - alpha_each) and of the power (1 - 0.2 / pairs: both pairs
    clear together), the SD at its upper 80% confidence limit sqrt(4 / chi2(0.2, 4)) times
    the pilot's (Browne 1995)."""
    b = mcb.mcb(mcb.pairwise(Y), delta=0.005, alpha=0.05)
    n = int(mcb.seeds_to_within(b, 1, 0.005))
    up = math.sqrt(4 / CHI2_20_4)
    assert up == pytest.approx(math.sqrt(4 / stats.chi2.ppf(0.2, 4)), rel=1e-3)

    def bound(k: int, j: int) -> float:
        m, sd = float(b.mean[1, j]), float(b.sd[1, j])
        return m + (stats.t.ppf(0.975, k - 1) + stats.t.ppf(0.9, k - 1)) * up * sd / math.sqrt(k)
    assert max(bound(n, 0), bound(n, 2)) <= 0.005 < max(bound(n - 1, 0), bound(n - 1, 2))
    plug_in = 2  # the count the report printed before: the pilot's SD, the bound's quantile
    while float(b.mean[1, 0]) + stats.t.ppf(0.975, plug_in - 1) * float(b.sd[1, 0]) \
            / math.sqrt(plug_in) > 0.005:
        plug_in += 1
    assert n > 2 * plug_in
    assert math.isinf(mcb.seeds_to_within(b, 2, 0.005))  # its estimate is past the margin


def test_the_shown_interval_is_the_t_interval_over_seeds():
    """The effect's 95% interval: mean of per-seed means ± t(0.975, seeds - 1) se, as the
    published quantile and scipy's one-sample t interval give (not z = 1.96)."""
    d = (Y[1] - Y[0])[None]  # [batch, cell, seed]
    e = fx.estimate(d[0])
    low, high = fx.interval(e, 0.95)
    diff = Y[1, 0] - Y[0, 0]
    se = diff.std(ddof=1) / math.sqrt(5)
    assert (float(low), float(high)) == pytest.approx((diff.mean() - T_975_4 * se,
                                                       diff.mean() + T_975_4 * se), abs=2e-6)
    ci = stats.ttest_1samp(diff, 0).confidence_interval(0.95)
    assert (float(low), float(high)) == pytest.approx((ci.low, ci.high), abs=1e-12)


# Student's sleep data (Cushny & Peebles 1905; R's ``sleep``): extra hours of sleep of ten
# patients under two drugs. R's documented ``t.test(extra[group == 1], extra[group == 2],
# paired = TRUE)`` prints t = -4.0621, df = 9, p-value = 0.002833, mean difference -1.58 and
# the 95 percent confidence interval -2.4598858 -0.7001142.
SLEEP_1 = np.array([0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0])
SLEEP_2 = np.array([1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4])


def test_two_levels_reproduce_the_published_paired_t_interval_of_the_sleep_data():
    """With two levels MCB is the paired t interval (one comparison): at alpha = 0.025 each
    one-sided bound is an end of R's published two-sided 95% interval."""
    y = np.stack([SLEEP_1, SLEEP_2])[:, None, :]  # patients are the blocks (our seeds)
    b = mcb.mcb(mcb.pairwise(y), delta=0.5, alpha=0.025)
    assert b.upper[1] == pytest.approx(2.4598858, abs=5e-8)  # drug 2 - drug 1 <= 2.46
    assert b.lower[1] == pytest.approx(0.7001142, abs=5e-8)  # ... and >= 0.70 > delta
    assert b.upper[0] == 0.0  # drug 1 - best <= max(0, -0.70)
    assert b.gap[1] == pytest.approx(1.58)
    assert list(b.status) == [mcb.WITHIN, mcb.WORSE]


def test_every_pair_bound_is_scipys_paired_t_bound_at_the_bonferroni_level():
    """An independent implementation: for five levels and eight seeds, ``U_i`` and ``L_i`` are
    the max over j of ``scipy.stats.ttest_rel``'s one-sided bounds at ``alpha / (k - 1)``."""
    rng = np.random.default_rng(7)
    k, seeds, alpha = 5, 8, 0.05
    y = (rng.normal(size=(1, seeds)) + rng.normal(scale=0.3, size=(k, seeds))
         + np.linspace(0, 0.4, k)[:, None])[:, None, :]
    b = mcb.mcb(mcb.pairwise(y), delta=0.1, alpha=alpha)
    level = 1 - alpha / (k - 1)
    for i in range(k):
        hi = [stats.ttest_rel(y[i, 0], y[j, 0], alternative="less")
              .confidence_interval(level).high for j in range(k) if j != i]
        lo = [stats.ttest_rel(y[i, 0], y[j, 0], alternative="greater")
              .confidence_interval(level).low for j in range(k) if j != i]
        assert b.upper[i] == pytest.approx(max(0.0, max(hi)), rel=1e-10)
        assert b.lower[i] == pytest.approx(max(lo), rel=1e-10)
