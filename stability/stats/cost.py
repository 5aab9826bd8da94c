"""Which levels cost the same: a cost difference counts only beyond the run-to-run spread.

A level's cost is its runs' training seconds (``report.decide.select.train_seconds``: median step
time x optimizer steps, measured on the study's device). Wall-clock seconds on a shared machine are
noisy: the same config measured 1.01-1.21x of itself across seeds in the default study, and
levels that do the same work (clipping at max_norm 1, 5 and 10) measured 1.01 / 1.02 / 1.21x
of clip off. A fixed tolerance (the earlier 10%) was never measured and let that noise decide.

The spread here is measured on the study itself: the pooled standard deviation ``s`` of log
seconds between runs of the same config (the seeds of one config do the same work, so whatever
they differ by is measurement noise, load included). A level counts as costlier than the
cheapest candidate only when it is *shown* costlier by more than that spread *and* by a
practical floor beyond it: the one-sided 95% lower bound of the difference of their mean log
seconds, ``diff - 1.645 * s * sqrt(1/n_i + 1/n_c)``, exceeds ``s + log(1 + floor)`` (as a level
counts as worse only when shown worse by more than the margin). A cost difference smaller than
a run's own variation is not one a user would see, one the level means cannot resolve is not
known, and zero spread (identical run times) is not certainty that 1% matters: the floor,
``FLOOR`` (10%, ``report.cost_tolerance``), is the least difference beyond the run-to-run
variation that counts. Why beyond it and not merely past the larger of the two: a cut at the
spread alone sits where the default study's own costs are (accum 4 at 0.84x, a log difference
of 0.17, against a spread of ~0.125 and a cut at ~0.16), so two draws of the same timings chose
different configs in 5.8% [5.0, 6.7] of null studies of 20 seeds; with the floor beyond the
spread the cut is at ~0.26 and they did not flip (tests/report/test_decision_choice.py).
On the default study's wall-clock runs ``s`` is 0.178 (a run's time varies by about 19%) and
max_norm 10 vs clip off differs by 0.117: the same cost (tests/stats/test_cost.py reads that
study). Works on arrays with leading batch axes, so the simulations run this code.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95  # of the one-sided bound a cost difference must clear
FLOOR = 0.10  # the least difference beyond the run-to-run spread (report.cost_tolerance)


@dataclass(frozen=True)
class Cost:
    """Each level's mean log training seconds and the spread that makes two of them differ.

    Attributes:
        log_mean: mean log seconds of the level's runs ``[..., level]`` (NaN: none measured).
        spread: pooled SD of log seconds between runs of one config ``[...]`` (NaN: no config
            ran twice, so no difference is known to be real).
        runs: the runs with a measured cost at each level ``[..., level]``.
    """

    log_mean: np.ndarray
    spread: np.ndarray
    runs: np.ndarray

    def ratio(self, i: int) -> np.ndarray:
        """Each level's cost over level ``i``'s (``[..., level]``)."""
        return np.exp(self.log_mean - self.log_mean[..., i:i + 1])

    @property
    def spread_share(self) -> np.ndarray:
        """The spread as a share of a run's time (``exp(spread) - 1``)."""
        return np.expm1(self.spread)


def level_cost(seconds: np.ndarray) -> Cost:
    """The cost of each level from ``seconds[..., level, cell, seed]`` (NaN: not run).

    Each config (a level in a cell) with two or more runs contributes its between-seed variance
    of log seconds; their mean is the spread's square.
    """
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # levels and configs without runs
        logs = np.log(np.where(np.asarray(seconds, dtype=float) > 0, seconds, np.nan))
        log_mean = np.nanmean(logs.reshape(logs.shape[:-2] + (-1,)), axis=-1)
        var = np.nanvar(logs, axis=-1, ddof=1)  # [..., level, cell]
        spread = np.sqrt(np.nanmean(var.reshape(var.shape[:-2] + (-1,)), axis=-1))
    runs = np.sum(np.isfinite(logs.reshape(logs.shape[:-2] + (-1,))), axis=-1)
    return Cost(log_mean, spread, runs)


def equally_cheap(cost: Cost, pool: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """The levels of ``pool`` not shown costlier than the pool's cheapest by more than the spread
    and the floor beyond it.

    Args:
        cost: ``level_cost``.
        pool: the candidate levels ``[..., level]`` (bool).
        floor: the share a difference must exceed beyond the spread (``report.cost_tolerance``;
            0: the measured spread alone).

    Returns:
        ``[..., level]`` bool: the candidates cost cannot tell apart. Where no candidate has a
        known cost, or no spread is measured, cost decides nothing: the whole pool.
    """
    pool = np.asarray(pool, dtype=bool)
    known = np.isfinite(cost.log_mean)
    masked = np.where(pool & known, cost.log_mean, np.inf)
    first = np.argmin(masked, axis=-1)[..., None]
    cheapest = np.take_along_axis(masked, first, axis=-1)
    n_c = np.take_along_axis(np.asarray(cost.runs, dtype=float), first, axis=-1)
    s = np.asarray(cost.spread, dtype=float)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        se = s * np.sqrt(1 / np.asarray(cost.runs, dtype=float) + 1 / n_c)
    lower = cost.log_mean - cheapest - stats.norm.ppf(CONFIDENCE) * se
    shown = lower > s + np.log1p(floor)
    cheap = pool & known & ~shown
    blind = np.isinf(cheapest) | ~np.isfinite(s)
    return np.where(blind, pool, cheap)
