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
the fallback *is* the answer. Taking "the cheapest level not shown worse" there kept the
default (clip off) in 84% of simulated studies where it was 0.0068 worse than the best, since
showing a level worse needs margin + 4.5 se at 5 seeds. So the fallback follows the evidence:
the levels whose *point estimate* of the gap to the best (``gap_i = max_j mean(d_ij)``, the
estimate ``U_i`` bounds) is within the margin, then the cheapest, then the simplest. It is a
best guess, not a guarantee: the report prints the chosen level's ``U_i`` beside it ("at most
0.0098 worse than the best, 95% simultaneous") and the seeds that would show it within the
margin (``seeds_to_within``). Its error and regret on the default study's effects, the real
covariance of its runs and a scan of gaps are in tests/report/test_decision_simulation.py.

Everything works on arrays with any leading batch shape: the report and the simulations run
this code.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

# within delta of the best / shown worse / neither / never run (no runs: never a candidate)
WITHIN, WORSE, OPEN, ABSENT = "within", "worse", "open", "absent"


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
        status: ``WITHIN`` (``U_i <= delta``), ``WORSE`` (``L_i > delta``) or ``OPEN``.
        alpha_each: the one-sided level of each comparison (``[...]``).
        gap: ``max(0, max_j mean(d_ij))``, the point estimate of ``mu_i - min_j mu_j``.
        mean: ``mean(d_ij)`` ``[..., i, j]``; sd: the SD of ``d_ij`` over seeds; n: its seeds.
    """

    upper: np.ndarray
    lower: np.ndarray
    status: np.ndarray
    alpha_each: np.ndarray
    gap: np.ndarray
    mean: np.ndarray
    sd: np.ndarray
    n: np.ndarray


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
    ok = n >= 2
    # Zero spread is not certainty: identical differences from a few seeds (or identical runs)
    # say nothing about a new seed's noise, so a pair without spread bounds nothing unless the
    # two levels are the very same runs (mean 0).
    degenerate = ok & ~(se > 0) & (mean != 0)
    hi = np.where(ok & ~degenerate, mean + t * np.nan_to_num(se), np.inf)
    lo = np.where(ok & ~degenerate, mean - t * np.nan_to_num(se), -np.inf)
    eye = np.eye(k, dtype=bool)
    hi = np.where(eye, -np.inf, hi)
    lo = np.where(eye, -np.inf, lo)
    lower = lo.max(axis=-1) if k > 1 else np.full(d.shape[:-2], -np.inf)
    delta = np.asarray(delta, dtype=float)[..., None] if np.ndim(delta) else delta
    if constrained and k > 1:
        out = (lower > delta) & (np.asarray(delta) >= 0)  # no margin: nothing is set aside
        hi = np.where(out[..., None, :], -np.inf, hi)
    upper = np.maximum(0.0, hi.max(axis=-1)) if k > 1 else np.zeros(d.shape[:-2])
    point = np.where(eye | ~np.isfinite(mean), -np.inf, mean)
    gap = np.maximum(0.0, point.max(axis=-1)) if k > 1 else np.zeros(d.shape[:-2])
    status = np.where(upper <= delta, WITHIN, np.where(lower > delta, WORSE, OPEN))
    status = np.where(present | (k == 1), status, ABSENT)
    return Best(upper, lower, status, alpha_each, gap, mean, sd, n)


WITHIN_BASIS, NEAR_BASIS, LOWEST_BASIS = "within", "near", "lowest"


def basis(status: np.ndarray, gap: np.ndarray, delta: float | np.ndarray,
          available: np.ndarray | None = None) -> np.ndarray:
    """What the choice rests on ``[...]``: some available level shown within the margin
    (``within``), else some level whose point gap is within it (``near``), else neither (no
    margin: ``lowest``, the smallest point gap)."""
    status = np.asarray(status)
    avail = status != ABSENT if available is None else (status != ABSENT) & available
    delta = np.asarray(delta, dtype=float)[..., None] if np.ndim(delta) else delta
    within = (avail & (status == WITHIN)).any(axis=-1)
    near = (avail & (status != WORSE) & (gap <= delta)).any(axis=-1)
    return np.where(within, WITHIN_BASIS, np.where(near, NEAR_BASIS, LOWEST_BASIS))


def candidates(status: np.ndarray, gap: np.ndarray, delta: float | np.ndarray,
               available: np.ndarray | None = None) -> np.ndarray:
    """The levels the choice may take ``[..., k]`` (bool), per ``basis``.

    ``within``: the levels shown within the margin. ``near``: the levels whose point estimate
    of the gap to the best is within the margin (never one shown worse). ``lowest``: the
    level(s) with the smallest point gap.
    """
    status = np.asarray(status)
    avail = status != ABSENT if available is None else (status != ABSENT) & available
    d = np.asarray(delta, dtype=float)[..., None] if np.ndim(delta) else delta
    within = avail & (status == WITHIN)
    near = avail & (status != WORSE) & (gap <= d)
    low = np.min(np.where(avail, gap, np.inf), axis=-1, keepdims=True)
    lowest = avail & (gap <= low)
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


def seeds_to_within(best: Best, i: int, delta: float, limit: int = 10_000) -> float:
    """Seeds at which level ``i`` (one study, no batch axes) would be shown within ``delta``.

    Assumes each pair's mean difference and SD stay as measured: the smallest ``n`` with
    ``mean(d_ij) + t(1 - alpha_each, n - 1) * sd_ij / sqrt(n) <= delta`` for every ``j``.
    ``inf``: the point estimate itself is past the margin (more seeds cannot show it within);
    NaN: a pair without spread to size it by.
    """
    need = 2
    for j in range(best.mean.shape[-1]):
        m, sd = float(best.mean[i, j]), float(best.sd[i, j])
        if j == i or not np.isfinite(m):
            continue
        if m >= delta:
            return float("inf")
        if not (sd > 0) or not np.isfinite(sd):
            return float("nan")
        q = 1 - float(best.alpha_each)

        def clears(k: int, m: float = m, sd: float = sd, q: float = q) -> bool:
            return m + stats.t.ppf(q, k - 1) * sd / np.sqrt(k) <= delta
        hi = 2
        while hi <= limit and not clears(hi):
            hi *= 2
        if hi > limit and not clears(limit):
            return float("inf")
        lo, hi = hi // 2, min(hi, limit)  # clears(hi); not clears(lo) unless lo < 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if clears(mid) else (mid, hi)
        n = max(2, hi)
        need = max(need, n)
    return float(need)
