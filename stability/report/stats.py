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
from scipy import stats


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
        return MeanCI(0, math.nan, math.nan, math.nan, math.nan)
    if not np.all(np.isfinite(x)):
        return MeanCI(n, math.inf if not np.isnan(x).any() else math.nan,
                      math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n < 2:
        return MeanCI(n, mean, math.nan, math.nan, math.nan)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
    return MeanCI(n, mean, std, mean - half, mean + half)


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
        return Paired(0, seeds, math.nan, math.nan, math.nan, math.nan, math.nan)
    ci = mean_ci(d, confidence)
    if n < 2:
        return Paired(n, seeds, ci.mean, math.nan, math.nan, math.nan, math.nan)
    if np.all(d == 0):  # identical results: no evidence of any difference
        return Paired(n, seeds, 0.0, 0.0, 0.0, 1.0, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant differences: t is infinite
        p_t = float(stats.ttest_1samp(d, 0.0).pvalue)
    if math.isnan(p_t):  # zero spread with a non-zero mean: every seed moved the same way
        p_t = 0.0
    return Paired(n, seeds, ci.mean, ci.low, ci.high, p_t, wilcoxon_p(d))


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
