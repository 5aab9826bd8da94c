"""Multiple comparisons with the best (Hsu 1984), seeds as blocks: which levels are near the best.

The decision picks one level per factor (or per group of interacting factors). Which levels may
it pick? Those the data show to be within a margin ``delta`` of the *best* level, where "best"
is the level with the lowest true mean loss — unknown, and chosen from the same runs. Testing
the observed best against the others on the runs that picked it is the winner's curse (a 21%
false "helps" rate under a global null of the default grid); multiple comparisons with the best
(MCB) are intervals for ``mu_i - min_j mu_j`` that hold *simultaneously for every level*, so
they stay valid for a level chosen after looking.

The construction (smaller is better). Let ``b`` be the true best level and, for each pair,
``d_ij[s]`` the per-seed mean paired difference ``level i - level j`` over the cells of the
other factors (``pairwise``). Let E be the event that, for every ``j != b``,
``mu_j - mu_b <= mean(d_jb) + t * se(d_jb)`` with the one-sided quantile ``t`` at
``alpha_each = alpha / (k - 1)`` (Bonferroni over the k - 1 comparisons with the true best).
``P(E) >= 1 - alpha``. Under E, simultaneously for every level ``i``:

- ``mu_i - mu_b <= U_i = max(0, max_j mean(d_ij) + t * se(d_ij))``: a level whose ``U_i`` is at
  most ``delta`` is **within delta of the best**;
- the true best is never shown worse: ``L_i = max_j mean(d_ij) - t * se(d_ij) > delta`` (some
  level beats ``i`` by more than ``delta``) cannot hold for ``i = b``.

Several factors are decided at once by splitting ``alpha`` over them (Bonferroni), so the
guarantee holds for all of them together.

**The choice** (``choose``). If some level is shown within the margin, the cheapest of those,
then the simplest, is taken: the choice carries the guarantee. With 5 seeds that is rare, and
the fallback *is* the answer. It takes the levels within the margin one comparison at a time
(``NEAR``: ``single``, the same bound with each comparison at the factor's whole alpha; for
each such level alone, the chance that it is more than the margin worse than the best is at
most that alpha), then the cheapest, then the simplest; if no level is near, the level with the
lowest point estimate (``gap_i = 0``; never one shown worse), cost and simplicity breaking exact
ties only. Both are best guesses, printed with ``U_i`` ("at most 0.0098 worse than the best,
95% simultaneous") and the seeds that would show the level within the margin with 80% power
(``seeds_to_within``). Dropped, measured on the same scenarios (docs/report.md, "The
decision"): "the cheapest, then simplest, level whose point gap is within the margin" took a
level 16% cheaper and 1.25x the margin worse in 17% of studies; "the smallest ``U_i``" ranks
levels by four-df SD estimates that vary by a third between pairs, and took it in 12% on the
study's own covariance. What this rule costs: with a pair's se about half the margin (5 seeds,
independent noise) nothing is near, so neither simplicity nor cost decides: clip off is kept in
about a quarter of null studies, and a precision 3.7x as costly is taken whenever its estimate
is the lowest (tests/report/test_decision_choice.py).

Everything works on arrays with any leading batch shape: the report and the simulations run
this code.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

# within delta of the best / within it one comparison at a time / shown worse / neither /
# never run (no runs: never a candidate)
WITHIN, NEAR, WORSE, OPEN, ABSENT = "within", "near", "worse", "open", "absent"


def pairwise(y: np.ndarray) -> np.ndarray:
    """Per-seed mean paired differences ``d[..., i, j, seed]`` from ``y[..., level, cell, seed]``.

    A cell x seed point missing at either level (NaN) is left out of that pair only, so a
    missing run costs its own pairs and an extra seed counts wherever both levels ran it. A seed
    with no common cell is NaN for that pair.
    """
    y = np.asarray(y, dtype=float)
    d = y[..., :, None, :, :] - y[..., None, :, :, :]  # [..., i, j, cell, seed]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN seed: NaN is the answer
        return np.nanmean(d, axis=-2)


@dataclass(frozen=True)
class Best:
    """MCB bounds of every level of a factor (arrays ``[..., level]``).

    Attributes:
        upper: ``U_i``, the simultaneous upper bound of ``mu_i - min_j mu_j`` (inf: a pair
            with fewer than 2 seeds).
        lower: ``L_i``, the largest lower bound of ``mu_i - mu_j`` over the other levels.
        status: ``WITHIN`` (``U_i <= delta``), ``WORSE`` (``L_i > delta``), ``NEAR``
            (``single <= delta``) or ``OPEN``.
        alpha_each: the one-sided level of each comparison (``[...]``).
        gap: ``max(0, max_j mean(d_ij))``, the point estimate of ``mu_i - min_j mu_j``.
        mean: ``mean(d_ij)`` ``[..., i, j]``; sd: the SD of ``d_ij`` over seeds; n: its seeds.
        single: ``max(0, max_j mean(d_ij) + t(1 - alpha, n - 1) * se_ij)``: the same bound one
            comparison at a time, each at the factor's whole ``alpha`` (not simultaneous).
    """

    upper: np.ndarray
    lower: np.ndarray
    status: np.ndarray
    alpha_each: np.ndarray
    gap: np.ndarray
    mean: np.ndarray
    sd: np.ndarray
    n: np.ndarray
    single: np.ndarray


def mcb(d: np.ndarray, delta: float | np.ndarray, alpha: float,
        constrained: bool = False) -> Best:
    """Multiple comparisons with the best from pairwise per-seed differences.

    Args:
        d: ``pairwise`` output ``[..., k, k, seed]`` (NaN: seed missing for that pair).
        delta: the margin (loss units), a scalar or one per leading batch element.
        alpha: the error this factor may spend (``alpha / factors`` for several at once).
        constrained: ``U_i`` over the levels not shown worse only. Under the same event E the
            true best is never shown worse (``L_b <= 0 <= delta``), so it is among them and
            ``mu_i - mu_b <= hi_ib`` still bounds the gap; a level that left a study early
            (the decide study, ``stats.shown``), its few seeds giving wide pairs, then bounds
            nothing it cannot. False (the fixed study's report): every level, as published.

    Returns:
        The bounds and each level's status.
    """
    d = np.asarray(d, dtype=float)
    k = d.shape[-2]
    present = np.isfinite(d).any(axis=(-2, -1))  # a level never run pairs with nothing
    # Bonferroni over the comparisons with the true best among the levels that ran.
    alpha_each = alpha / np.maximum(present.sum(axis=-1) - 1, 1)
    n = np.sum(np.isfinite(d), axis=-1)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # pairs with < 2 seeds: inf below
        mean = np.nanmean(d, axis=-1)
        sd = np.nanstd(d, axis=-1, ddof=1)
        se = sd / np.sqrt(n)
        t = stats.t.ppf(1 - np.asarray(alpha_each)[..., None, None], np.maximum(n - 1, 1))
        t_one = stats.t.ppf(1 - np.asarray(alpha)[..., None, None], np.maximum(n - 1, 1))
    ok = n >= 2
    # Zero spread is not certainty: identical differences from a few seeds (or identical runs)
    # say nothing about a new seed's noise, so a pair without spread bounds nothing unless the
    # two levels are the very same runs (mean 0).
    degenerate = ok & ~(se > 0) & (mean != 0)
    hi = np.where(ok & ~degenerate, mean + t * np.nan_to_num(se), np.inf)
    lo = np.where(ok & ~degenerate, mean - t * np.nan_to_num(se), -np.inf)
    one = np.where(ok & ~degenerate, mean + t_one * np.nan_to_num(se), np.inf)
    # A level never run is no comparison (as in the Bonferroni count above): without this, one
    # absent level (a grid that is not fully crossed) made every other level's bound infinite.
    skip = np.eye(k, dtype=bool) | ~present[..., None, :]
    hi = np.where(skip, -np.inf, hi)
    lo = np.where(skip, -np.inf, lo)
    one = np.where(skip, -np.inf, one)
    lower = lo.max(axis=-1) if k > 1 else np.full(d.shape[:-2], -np.inf)
    delta = np.asarray(delta, dtype=float)[..., None] if np.ndim(delta) else delta
    if constrained and k > 1:
        out = (lower > delta) & (np.asarray(delta) >= 0)  # no margin: nothing is set aside
        hi = np.where(out[..., None, :], -np.inf, hi)
        one = np.where(out[..., None, :], -np.inf, one)
    upper = np.maximum(0.0, hi.max(axis=-1)) if k > 1 else np.zeros(d.shape[:-2])
    single = np.maximum(0.0, one.max(axis=-1)) if k > 1 else np.zeros(d.shape[:-2])
    point = np.where(skip | ~np.isfinite(mean), -np.inf, mean)
    gap = np.maximum(0.0, point.max(axis=-1)) if k > 1 else np.zeros(d.shape[:-2])
    status = np.where(upper <= delta, WITHIN, np.where(
        lower > delta, WORSE, np.where(single <= delta, NEAR, OPEN)))
    status = np.where(present | (k == 1), status, ABSENT)
    return Best(upper, lower, status, alpha_each, gap, mean, sd, n, single)


WITHIN_BASIS, NEAR_BASIS, LOWEST_BASIS = "within", "near", "lowest"


def basis(status: np.ndarray, gap: np.ndarray, delta: float | np.ndarray,
          available: np.ndarray | None = None) -> np.ndarray:
    """What the choice rests on ``[...]``: some available level shown within the margin
    (``within``), else some level within it one comparison at a time (``near``), else the
    lowest point estimate (``lowest``). ``gap`` and ``delta`` are taken as ``candidates``
    takes them; the status already says what is within (``mcb`` set it from ``delta``)."""
    status = np.asarray(status)
    avail = status != ABSENT if available is None else (status != ABSENT) & available
    within = (avail & (status == WITHIN)).any(axis=-1)
    near = (avail & (status == NEAR)).any(axis=-1)
    return np.where(within, WITHIN_BASIS, np.where(near, NEAR_BASIS, LOWEST_BASIS))


def candidates(status: np.ndarray, gap: np.ndarray, delta: float | np.ndarray,
               available: np.ndarray | None = None) -> np.ndarray:
    """The levels the choice may take ``[..., k]`` (bool), per ``basis``.

    ``within``: the levels shown within the margin. ``near``: the levels within it one
    comparison at a time. ``lowest``: the level(s) with the smallest point gap to the best,
    never one shown worse unless every level is. ``status`` says which levels are within
    (``mcb`` set it from ``delta``, which is not read again).
    """
    status = np.asarray(status)
    avail = status != ABSENT if available is None else (status != ABSENT) & available
    within = avail & (status == WITHIN)
    near = avail & (status == NEAR)
    fair = avail & (status != WORSE)
    fair = np.where(fair.any(axis=-1, keepdims=True), fair, avail)
    low = np.min(np.where(fair, gap, np.inf), axis=-1, keepdims=True)
    lowest = fair & (gap <= low)
    return np.where(within.any(axis=-1, keepdims=True), within,
                    np.where(near.any(axis=-1, keepdims=True), near, lowest))


def choose(pool: np.ndarray, cheap: np.ndarray, simplicity: np.ndarray,
           mean: np.ndarray) -> np.ndarray:
    """Index of the chosen level ``[...]``: among ``pool``, the equally cheapest (``cheap``,
    ``stats.cost.equally_cheap``), then the simplest, then the lowest mean.

    Args:
        pool: ``candidates`` ``[..., k]``.
        cheap: the candidates cost cannot tell apart from the cheapest ``[..., k]``.
        simplicity: rank of each level, 0 simplest ``[k]``.
        mean: each level's mean loss ``[..., k]`` (the last tie-break).
    """
    keep = np.asarray(pool, dtype=bool) & np.asarray(cheap, dtype=bool)
    simple = np.broadcast_to(np.asarray(simplicity, dtype=float), keep.shape)
    rank = np.argsort(np.argsort(np.where(np.isfinite(mean), mean, np.inf), axis=-1), axis=-1)
    return np.argmin(np.where(keep, simple * 1e6 + rank, np.inf), axis=-1)


POWER, SD_CONFIDENCE = 0.8, 0.8  # of the seeds that would decide an open choice (below)


def seeds_to_within(best: Best, i: int, delta: float, power: float = POWER,
                    sd_confidence: float = SD_CONFIDENCE, limit: int = 10_000) -> float:
    """Seeds at which a fresh study would show level ``i`` within ``delta`` with probability
    ``power`` (one study, no batch axes).

    Level ``i`` is shown within when every pair's bound ``mean(d_ij) + t(1 - alpha_each, n - 1)
    * sd_ij / sqrt(n)`` clears ``delta``. Each pair is sized for power by the t quantiles of the
    one-sided test (``t(1 - alpha_each, n - 1) + t(power_each, n - 1)``, the usual
    approximation to the noncentral t), with the pairs' misses split by Bonferroni
    (``power_each = 1 - (1 - power) / pairs``, so all of them clear together with probability
    at least ``power``). The SD is not the pilot's own: five seeds underestimate it about half
    the time, so each pair is sized with the one-sided ``sd_confidence`` upper confidence limit
    of its SD, ``sd * sqrt((n0 - 1) / chi2(1 - sd_confidence, n0 - 1))`` (Browne 1995, "On the
    use of a pilot sample for sample size determination", Statistics in Medicine 14:1933-1940).
    The mean difference is the pilot's. ``inf``: the point estimate itself is past the margin
    (more seeds cannot show it within); NaN: a pair without spread to size it by.
    """
    pairs = [j for j in range(best.mean.shape[-1])
             if j != i and np.isfinite(float(best.mean[i, j]))]
    q = 1 - float(best.alpha_each)
    q_power = 1 - (1 - power) / max(len(pairs), 1)
    need = 2
    for j in pairs:
        m, sd, n0 = float(best.mean[i, j]), float(best.sd[i, j]), int(best.n[i, j])
        if m >= delta:
            return float("inf")
        if not (sd > 0) or not np.isfinite(sd):
            return float("nan")
        up = sd * math.sqrt((n0 - 1) / stats.chi2.ppf(1 - sd_confidence, n0 - 1))

        def clears(k: int, m: float = m, up: float = up) -> bool:
            return m + (stats.t.ppf(q, k - 1) + stats.t.ppf(q_power, k - 1)) * up \
                / math.sqrt(k) <= delta
        hi = 2
        while hi <= limit and not clears(hi):
            hi *= 2
        if hi > limit and not clears(limit):
            return float("inf")
        lo, hi = hi // 2, min(hi, limit)  # clears(hi); not clears(lo) unless lo < 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if clears(mid) else (mid, hi)
        need = max(need, max(2, hi))
    return float(need)
