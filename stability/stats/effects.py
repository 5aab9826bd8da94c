"""A factor's effect from every run of a study, seeds as blocks, and the four-word decision rule.

The unit of evidence is a *paired difference inside a block*: for a contrast such as "clip at
max_norm 5 vs clip off", every combination of the other factors (a *cell*, e.g. bf16 accum 2)
and every seed gives one difference ``d[cell, seed]`` between two runs that share everything but
the contrasted setting. Seed and the other factors cancel inside each difference; the question
is what the differences say about the mean effect ``theta`` for a *new* seed.

Model (one per contrast): ``d[c, s] = theta + gamma[c] + v[s] + e[c, s]``. ``gamma`` (how the
effect varies with the other factors) is fixed and averaged over the design; ``v`` is the
seed x setting interaction, random, because the answer must hold for seeds not run; ``e`` is
run noise. Each seed's mean over the cells, ``D[s] = theta + v[s] + mean(e[., s])``, is then
independent across seeds with one variance, so the t-test on the ``S`` per-seed means is exact
(``S - 1`` degrees of freedom) whatever the size of ``v``: every run contributes, and the seed
stays the unit of replication.

Why not pool the within-seed residual (``(C - 1)(S - 1)`` df) when the seeds happen to agree,
as a REML fit truncating ``var(v)`` at zero would: simulated on a 12-cell, 5-seed contrast,
that rule's false-positive rate at alpha / 8 (Holm's first step over the default study's 8
contrasts) is 0.013-0.014 instead of 0.006 when ``sd(v)`` is 0.3-0.5 of the run noise
(docs/report.md, "Factor effects"). The per-seed test holds its level at every ``sd(v)``.

Decisions, each over a family with Holm's step-down correction at ``alpha``:

- **helps / hurts**: the two-sided t-test of ``theta = 0``;
- **equivalent**: two one-sided tests (TOST) of ``|theta| >= margin``;
- **undecided**: neither.

Everything here works on arrays with any leading batch shape, so the simulation runs the very
rule the report uses on thousands of synthetic studies at once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

from stability.stats.paired import seeds_needed

HELPS, HURTS, EQUIVALENT, UNDECIDED = "helps", "hurts", "equivalent", "undecided"


@dataclass(frozen=True)
class Estimate:
    """Mean paired difference with its standard error (arrays of one batch shape).

    Attributes:
        mean: the estimated effect (other - reference: < 0 lowers the loss).
        se: its standard error.
        df: degrees of freedom of ``se`` (seeds - 1).
        sd_seed: the SD of the per-seed means (what power and seed counts scale with).
        cells: C, the cells of the other factors the contrast averages over.
        seeds: S.
    """

    mean: np.ndarray
    se: np.ndarray
    df: np.ndarray
    sd_seed: np.ndarray
    cells: int
    seeds: int


def estimate(d: np.ndarray) -> Estimate:
    """The effect and its standard error from paired differences ``d[..., cell, seed]``.

    A missing point (NaN: a run absent on either side) drops only itself: each seed's mean is
    over the cells it has, a seed with none is left out, and the seeds that remain are the
    replicates (at least 2, else the mean and its error are NaN). Complete data gives the plain
    mean of the per-seed means.

    Args:
        d: paired differences, shape ``(..., C, S)``.

    Returns:
        The ``Estimate``: the mean of the per-seed means, their SD over ``sqrt(S)``.
    """
    d = np.asarray(d, dtype=float)
    c, s = d.shape[-2:]
    if s < 2:
        raise ValueError(f"an effect needs at least 2 seeds, got {s}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN seeds and pairs: NaN below
        seed_means = np.nanmean(d, axis=-2)
        n = np.sum(np.isfinite(seed_means), axis=-1)
        mean = np.nanmean(seed_means, axis=-1)
        sd = np.nanstd(seed_means, axis=-1, ddof=1)
    few = n < 2
    sd = np.where(few, np.nan, sd)
    mean = np.where(n < 1, np.nan, mean)
    df = np.where(few, np.nan, n - 1).astype(float)
    return Estimate(mean=mean, se=sd / np.sqrt(np.maximum(n, 1)), df=df, sd_seed=sd, cells=c,
                    seeds=int(np.max(n)))


def p_two_sided(e: Estimate) -> np.ndarray:
    """p-value of ``theta = 0`` (two-sided t).

    Zero spread is no evidence: identical differences from a few seeds say nothing about a new
    seed's noise, so without spread p is 1 (undecided), never 0.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(e.mean) / e.se
        p = 2 * stats.t.sf(t, e.df)
    return np.where(e.se > 0, p, 1.0)


def p_equivalent(e: Estimate, margin: float | np.ndarray) -> np.ndarray:
    """TOST p-value of ``|theta| >= margin`` (small: the effect lies within ``+-margin``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lower = stats.t.sf((e.mean + margin) / e.se, e.df)  # H0: theta <= -margin
        upper = stats.t.cdf((e.mean - margin) / e.se, e.df)  # H0: theta >= +margin
    p = np.maximum(lower, upper)
    # Without spread only identical runs (every difference exactly 0) are equivalent.
    return np.where(e.se > 0, p, np.where(e.mean == 0, 0.0, 1.0))


def interval(e: Estimate, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """The two-sided ``confidence`` t interval of the effect."""
    half = stats.t.ppf((1 + confidence) / 2, e.df) * e.se
    return e.mean - half, e.mean + half


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values over the last axis (any batch shape; NaN = not in the family)."""
    p = np.asarray(p, dtype=float)
    filled = np.where(np.isnan(p), np.inf, p)
    order = np.argsort(filled, axis=-1, kind="stable")
    ranked = np.take_along_axis(filled, order, axis=-1)
    m = np.sum(~np.isnan(p), axis=-1, keepdims=True)
    factor = np.maximum(m - np.arange(p.shape[-1]), 1)
    adjusted = np.minimum(np.maximum.accumulate(ranked * factor, axis=-1), 1.0)
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return np.where(np.isnan(p), np.nan, out)


def decide(mean: np.ndarray, p_diff_holm: np.ndarray, p_equiv_holm: np.ndarray,
           alpha: float) -> np.ndarray:
    """The verdict per contrast: equivalent, else helps / hurts, else undecided.

    "Equivalent" comes first: an effect shown to lie inside the margin is negligible even
    when it is also shown to differ from zero (the report says both). A loss-lowering
    difference (``mean < 0``) helps.
    """
    sig = p_diff_holm < alpha
    return np.where(p_equiv_holm < alpha, EQUIVALENT,
                    np.where(sig & (mean < 0), HELPS, np.where(sig, HURTS, UNDECIDED)))


def tost_power(theta: float, sd: float, n: int, margin: float, alpha: float) -> float:
    """A lower bound on the power of TOST on ``n`` seeds to show ``|theta| < margin``.

    With ``T1 = (m - margin)/se`` and ``T2 = (m + margin)/se`` (noncentral t, ``n - 1`` df),
    TOST succeeds when ``T1 <= -t`` and ``T2 >= t``; since ``T2 >= T1`` that probability is at
    least ``P(T1 <= -t) - P(T2 < t)``.
    """
    if n < 2 or not (sd > 0) or not np.isfinite(sd):
        return float("nan")
    se, df = sd / np.sqrt(n), n - 1
    t = stats.t.ppf(1 - alpha, df)
    low = stats.nct.cdf(-t, df, (theta - margin) / se)
    high = stats.nct.cdf(t, df, (theta + margin) / se)
    return float(max(0.0, low - high))


def seeds_to_decide(mean: float, sd_seed: float, margin: float, alpha: float, power: float,
                    limit: int = 10_000) -> float:
    """Seeds at which an undecided contrast would be decided with ``power``, if ``mean`` is true.

    The smaller of the seeds the two-sided test needs to detect ``mean`` and, when
    ``|mean| < margin``, the seeds TOST needs to show equivalence. ``alpha`` is the level the
    first test of the family faces (``alpha / m`` under Holm). NaN without spread, ``inf``
    beyond ``limit``.
    """
    if not (sd_seed > 0) or not np.isfinite(sd_seed):
        return float("nan")
    best = seeds_needed(mean, sd_seed, alpha, power, limit) if abs(mean) > 0 else np.inf
    if abs(mean) < margin:
        n = 2
        while n <= min(limit, best) and tost_power(mean, sd_seed, n, margin, alpha) < power:
            n = n + 1 if n < 64 else n * 2
        best = min(best, n if n <= limit else np.inf)
    return float(best)


@dataclass(frozen=True)
class StudyVerdicts:
    """Main-effect and interaction verdicts of whole studies (leading batch axes kept).

    Contrasts are ordered factor by factor, each level against level 0; interactions pair
    factors ``i < j`` in order, then levels ``a`` of ``i`` and ``b`` of ``j`` (both > 0): the
    order ``report.decide.factors.analyse`` uses.
    """

    mean: np.ndarray
    p_holm: np.ndarray
    p_equiv_holm: np.ndarray
    verdict: np.ndarray
    interaction_p_holm: np.ndarray


def study_verdicts(y: np.ndarray, k: int, margin: float, alpha: float = 0.05) -> StudyVerdicts:
    """The report's decisions on complete studies ``y[..., level_1, ..., level_k, seed]``.

    Args:
        y: best validation loss of every run: batch axes, ``k`` factor axes, then seeds.
        k: the number of factors.
        margin: the equivalence margin.
        alpha: family-wise error rate of each family (main effects, interactions).
    """
    lead = y.ndim - 1 - k
    ests, pairs = [], []
    for i in range(k):
        ax = lead + i
        for a in range(1, y.shape[ax]):
            ests.append(_cells(np.take(y, a, ax) - np.take(y, 0, ax), lead))
    for i in range(k):
        for j in range(i + 1, k):
            ai, aj = lead + i, lead + j
            for a in range(1, y.shape[ai]):
                diff = np.take(y, a, ai) - np.take(y, 0, ai)  # axis aj shifts down by one
                for b in range(1, y.shape[aj]):
                    twice = np.take(diff, b, aj - 1) - np.take(diff, 0, aj - 1)
                    pairs.append(_cells(twice, lead))
    mains = [estimate(d) for d in ests]
    mean = np.stack([e.mean for e in mains], axis=-1)
    p_holm = holm(np.stack([p_two_sided(e) for e in mains], axis=-1))
    p_eq = holm(np.stack([p_equivalent(e, margin) for e in mains], axis=-1))
    inter = (holm(np.stack([p_two_sided(estimate(d)) for d in pairs], axis=-1)) if pairs
             else np.empty(mean.shape[:-1] + (0,)))
    return StudyVerdicts(mean, p_holm, p_eq, decide(mean, p_holm, p_eq, alpha), inter)


def _cells(d: np.ndarray, lead: int) -> np.ndarray:
    """``d[lead..., levels of the other factors..., seed]`` as ``[lead..., cells, seed]``."""
    return d.reshape(d.shape[:lead] + (-1, d.shape[-1]))
