"""Seed statistics: mean with a t confidence interval, paired comparisons by seed, Holm.

Why a paired t-test first: with 5 seeds the exact two-sided Wilcoxon signed-rank test cannot
go below p = 2/2^5 = 0.0625, so it could never call anything significant at 0.05. The t-test
on the per-seed differences is the decision; the Wilcoxon p-value is reported beside it as a
distribution-free check.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats


@dataclass(frozen=True)
class MeanCI:
    """Mean, sample standard deviation and t confidence interval of a few seeds."""

    n: int
    mean: float
    std: float
    low: float
    high: float


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> MeanCI:
    """Mean, std (ddof=1) and the t interval ``mean +- t(n-1) * std / sqrt(n)``.

    An infinite value (a diverged seed) makes the mean infinite and the spread undefined (NaN);
    fewer than two values leave std and interval NaN.
    """
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return MeanCI(n=0, mean=math.nan, std=math.nan, low=math.nan, high=math.nan)
    if not np.all(np.isfinite(x)):
        return MeanCI(n=n, mean=math.inf if not np.isnan(x).any() else math.nan,
                      std=math.nan, low=math.nan, high=math.nan)
    mean = float(x.mean())
    if n < 2:
        return MeanCI(n=n, mean=mean, std=math.nan, low=math.nan, high=math.nan)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
    return MeanCI(n=n, mean=mean, std=std, low=mean - half, high=mean + half)


@dataclass(frozen=True)
class Paired:
    """``other - reference`` over the seeds both finished: > 0 means the reference is better."""

    n: int
    seeds: tuple[int, ...]
    mean_diff: float
    low: float
    high: float
    p_t: float  # two-sided paired t-test
    p_wilcoxon: float  # two-sided Wilcoxon signed-rank (exact for small n), the check
    sd: float = math.nan  # sample SD of the per-seed differences (what the power scales with)


def paired(reference: Mapping[int, float], other: Mapping[int, float],
           confidence: float = 0.95) -> Paired:
    """Compare two configs seed by seed on the seeds where both have a finite value.

    Args:
        reference: seed -> value (e.g. best validation loss of the winner).
        other: seed -> value of the config compared with it.
        confidence: level of the interval on the mean difference.

    Returns:
        The paired comparison; with fewer than two common seeds the p-values are NaN.
    """
    seeds = tuple(sorted(s for s in set(reference) & set(other)
                         if math.isfinite(reference[s]) and math.isfinite(other[s])))
    d = np.asarray([other[s] - reference[s] for s in seeds], dtype=float)
    n = len(d)
    if n == 0:
        return Paired(n=0, seeds=seeds, mean_diff=math.nan, low=math.nan, high=math.nan,
                      p_t=math.nan, p_wilcoxon=math.nan)
    ci = mean_ci(d, confidence)
    if n < 2:
        return Paired(n=n, seeds=seeds, mean_diff=ci.mean, low=math.nan, high=math.nan,
                      p_t=math.nan, p_wilcoxon=math.nan)
    if np.all(d == 0):  # identical results: no evidence of any difference
        return Paired(n=n, seeds=seeds, mean_diff=0.0, low=0.0, high=0.0, p_t=1.0,
                      p_wilcoxon=1.0, sd=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant differences: t is infinite
        p_t = float(stats.ttest_1samp(d, 0.0).pvalue)
    if math.isnan(p_t):  # zero spread with a non-zero mean: every seed moved the same way
        p_t = 0.0
    return Paired(n=n, seeds=seeds, mean_diff=ci.mean, low=ci.low, high=ci.high, p_t=p_t,
                  p_wilcoxon=wilcoxon_p(d), sd=ci.std)


def wilcoxon_p(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the differences (NaN if it is undefined)."""
    nonzero = d[d != 0]
    if len(nonzero) == 0:
        return 1.0
    try:
        return float(stats.wilcoxon(nonzero).pvalue)
    except ValueError:
        return math.nan


def wilcoxon_min_p(n: int) -> float:
    """The smallest two-sided p-value an exact Wilcoxon test on ``n`` pairs can reach."""
    return min(1.0, 2.0 / 2**n)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN and is not counted)."""
    p = np.asarray(p_values, dtype=float)
    valid = np.flatnonzero(~np.isnan(p))
    adjusted = np.full(len(p), math.nan)
    order = valid[np.argsort(p[valid], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def paired_power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test on ``n`` pairs to detect a mean difference ``effect``.

    Under a true mean difference ``effect`` the t statistic follows a noncentral t with
    ``n - 1`` degrees of freedom and noncentrality ``effect / (sd / sqrt(n))``; the power is
    the probability that it lands beyond either critical value ``+-t(1 - alpha/2, n - 1)``.
    """
    if n < 2 or not (sd > 0) or not math.isfinite(sd):
        return math.nan
    df, nc = n - 1, abs(effect) / (sd / math.sqrt(n))
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    upper = float(stats.nct.sf(crit, df, nc))
    lower = float(stats.nct.cdf(-crit, df, nc))  # the wrong-sign tail: tiny, and scipy
    return upper + (0.0 if math.isnan(lower) else lower)  # underflows it to NaN for large nc


def min_detectable(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest mean difference the paired t-test on ``n`` pairs detects with ``power``.

    Solves ``paired_power(d, sd, n, alpha) = power`` for ``d`` (the power grows with ``d``).
    NaN with fewer than two pairs or no spread to scale by.
    """
    if n < 2 or not (sd > 0) or not math.isfinite(sd):
        return math.nan
    hi = sd
    while paired_power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda d: paired_power(d, sd, n, alpha) - power, 0.0, hi,
                                 xtol=1e-12 * sd))


def seeds_needed(effect: float, sd: float, alpha: float = 0.05, power: float = 0.8,
                 limit: int = 10_000) -> float:
    """The fewest paired seeds (>= 2) at which the paired t-test detects ``effect`` with ``power``.

    NaN when it is undefined (no spread, no effect); ``inf`` beyond ``limit`` seeds.
    """
    if not (sd > 0) or not math.isfinite(sd) or not (abs(effect) > 0):
        return math.nan
    n = 2
    while paired_power(effect, sd, n, alpha) < power:
        n = n + 1 if n < 64 else n * 2  # past 64 seeds the exact count matters less
        if n > limit:
            return math.inf
    if n > 64:  # bisect back down to the exact count inside the last doubling
        lo = n // 2
        while lo + 1 < n:
            mid = (lo + n) // 2
            lo, n = (mid, n) if paired_power(effect, sd, mid, alpha) < power else (lo, mid)
    return float(n)
