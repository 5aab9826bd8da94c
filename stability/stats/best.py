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
guarantee holds for all of them together. Everything works on arrays with any leading batch
shape: the report and the simulations (tests/test_decision_simulation.py) run this code.
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
    """

    upper: np.ndarray
    lower: np.ndarray
    status: np.ndarray
    alpha_each: np.ndarray


def mcb(d: np.ndarray, delta: float | np.ndarray, alpha: float) -> Best:
    """Multiple comparisons with the best from pairwise per-seed differences.

    Args:
        d: ``pairwise`` output ``[..., k, k, seed]`` (NaN: seed missing for that pair).
        delta: the margin (loss units), a scalar or one per leading batch element.
        alpha: the error this factor may spend (``alpha / factors`` for several at once).

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
    upper = np.maximum(0.0, hi.max(axis=-1)) if k > 1 else np.zeros(d.shape[:-2])
    lower = lo.max(axis=-1) if k > 1 else np.full(d.shape[:-2], -np.inf)
    delta = np.asarray(delta, dtype=float)[..., None] if np.ndim(delta) else delta
    status = np.where(upper <= delta, WITHIN, np.where(lower > delta, WORSE, OPEN))
    status = np.where(present | (k == 1), status, ABSENT)
    return Best(upper, lower, status, alpha_each)


def pick_level(status: np.ndarray, cost: np.ndarray, simplicity: np.ndarray,
           mean: np.ndarray, cost_tolerance: float) -> np.ndarray:
    """Index of the chosen level ``[...]``: cheapest, then simplest, then lowest mean.

    Candidates are the levels ``WITHIN`` the margin; if none is, the levels not shown ``WORSE``
    (the true best is among them with probability ``1 - alpha``). Costs within
    ``cost_tolerance`` (a share) of the cheapest candidate's are equally cheap.

    Args:
        status: ``Best.status`` ``[..., k]``.
        cost: training seconds per run at each level ``[..., k]`` (NaN: unknown, never cheapest).
        simplicity: rank of each level, 0 simplest ``[k]``.
        mean: each level's mean loss ``[..., k]`` (the last tie-break).
        cost_tolerance: e.g. 0.1: a level must be 10% cheaper to win on cost.
    """
    status = np.asarray(status)
    within = status == WITHIN
    pool = np.where(within.any(axis=-1, keepdims=True), within,
                    (status != WORSE) & (status != ABSENT))
    cost = np.where(np.isfinite(cost), cost, np.inf)
    cheapest = np.min(np.where(pool, cost, np.inf), axis=-1, keepdims=True)
    cheap = pool & (cost <= cheapest * (1 + cost_tolerance))
    if np.isinf(cheapest).any():  # no known cost among the candidates: cost does not decide
        cheap = np.where(np.isinf(cheapest), pool, cheap)
    simple = np.broadcast_to(np.asarray(simplicity, dtype=float), cheap.shape)
    key = np.where(cheap, simple * 1e6 + np.argsort(np.argsort(mean, axis=-1), axis=-1), np.inf)
    return np.argmin(key, axis=-1)
